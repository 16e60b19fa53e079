"""``tollway audit show|list``: read logical requests and their ordered attempts from the audit store.

- ``show REQUEST_ID [--json]``: the request line, then each attempt in order with its outcome,
  status, timings and route; an attempt or request without its terminal event is marked
  ``INCOMPLETE``.
- ``list --since DURATION|ISO [--principal P] [--limit N] [--json]``: admitted requests, and
  requests rejected before admission (status 4xx, outcome ``rejected``, no attempts; the
  ``ADMITTED`` column then shows when it was rejected), newest first. ``DURATION`` is a number
  and a unit (``90s``, ``15m``, ``2h``, ``7d``, ``1w``) back from now; ``ISO`` is an ISO-8601 date
  or time (UTC when it has no offset). With ``--principal`` the read is one index query; without,
  it scans the table (an operator's tool, not a hot path).

The table is ``$TOLLWAY_TABLE_AUDIT``, else the audit table of stage ``$TOLLWAY_STAGE`` (default
``tollway``); the endpoint is ``$AWS_ENDPOINT_URL`` (a local cloud) or AWS. Exit status: 0, 1 when
the request is not found or the store cannot be read, 2 for usage errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, TextIO

import orjson

from tollway import aws
from tollway.audit.events import usage_counts
from tollway.audit.store import (
    MAX_LIST_LIMIT,
    AttemptView,
    AuditStore,
    AuditStoreError,
    DynamoDBAuditStore,
    RequestRecord,
    RequestView,
    StoreSettings,
    iso_ts,
)
from tollway.pricing.cost import usd
from tollway.up_state import read_state

__all__ = ["main", "parse_since", "render_list", "render_view"]

_DURATION: Final = re.compile(r"(\d+)([smhdw])")
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_MISSING: Final = "-"


def parse_since(text: str, now_ms: int) -> int:
    """``--since`` as epoch milliseconds: a duration back from ``now_ms``, or an ISO-8601 date or time."""
    value = text.strip()
    m = _DURATION.fullmatch(value)
    if m is not None:
        return max(0, now_ms - int(m.group(1)) * _UNIT_S[m.group(2)] * 1000)
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"--since {text!r}: expected a duration (15m, 2h, 7d) or an ISO-8601 time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0, int(when.timestamp() * 1000))


# ---------------------------------------------------------------- rendering


def _ms(value: float | None) -> str:
    return _MISSING if value is None else f"{value:.1f} ms"


def _at(ms: int | None) -> str:
    return _MISSING if ms is None else iso_ts(ms)


def _text(value: object) -> str:
    if value is None:
        return _MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _usage(record: RequestRecord) -> str:
    if record.usage is None:
        return f"{_MISSING} ({_text(record.usage_evidence)})"
    counts = " ".join(f"{k}={v}" for k, v in usage_counts(record.usage).items()) or _MISSING
    return f"{counts} ({_text(record.usage_evidence)})"


def _line(pairs: Iterable[tuple[str, object]]) -> str:
    return "  ".join(f"{k} {_text(v)}" for k, v in pairs)


def _request_lines(r: RequestRecord) -> list[str]:
    if r.rejected:
        state = "rejected before admission"
    else:
        state = "INCOMPLETE (no request_finished)" if r.incomplete else "complete"
        if r.admitted_at_ms is None:
            state += " (no request_admitted stored)"
    head = _line(
        [
            ("status", r.status),
            ("outcome", r.outcome),
            ("attempts", r.attempt_count),
            ("total", _ms(r.total_ms)),
            ("usage", _usage(r)),
        ]
    )
    return [
        f"request {r.request_id}  {state}  {head}",
        "  "
        + _line(
            [
                ("principal", r.principal_id),
                ("tenant", r.tenant_id),
                ("team", r.team_id),
                ("key", r.key_id),
                ("alias", r.alias),
                ("stream", r.stream),
                ("content", r.content_mode),
                *([("trace", r.trace_id)] if r.trace_id else []),
            ]
        ),
        "  "
        + _line(
            [
                *([("rejected", _at(r.rejected_at_ms))] if r.rejected else []),
                ("admitted", _at(r.admitted_at_ms)),
                ("finished", _at(r.finished_at_ms)),
                ("admission", _ms(r.admission_ms)),
                ("error", r.error_code),
                ("cancellation", r.cancellation),
                ("cost", None if r.cost is None else f"${usd(r.cost)}"),
                ("pricing", r.pricing_version),
            ]
        ),
        *([_pii_line(r.pii)] if r.pii else []),
        *_content_lines(r),
    ]


def _content_lines(r: RequestRecord) -> list[str]:
    """Where its captured content is (the reference, never the content), or why there is none."""
    lines = []
    if r.content:
        c = r.content
        lines.append(
            "  "
            + _line(
                [
                    ("stored", f"s3://{c.get('bucket')}/{c.get('key')}"),
                    ("sha256", c.get("digest")),
                    ("bytes", c.get("size")),
                    ("retention", c.get("retentionClass")),
                    ("purposes", ",".join(c.get("purposes") or ())),
                ]
            )
        )
    if r.content_dropped:
        lines.append("  " + _line([("content dropped", r.content_dropped.get("reason"))]))
    if r.content_deleted:
        d = r.content_deleted
        lines.append(
            "  "
            + _line(
                [
                    ("content deleted", _at(r.content_deleted_at_ms)),
                    ("by", d.get("deletedBy")),
                    ("reason", d.get("reason")),
                    ("existed", d.get("existed")),
                ]
            )
        )
    if r.export_manifest:
        m = r.export_manifest
        lines.append(
            "  " + _line([("manifest", m.get("key")), ("digest", m.get("digest")), ("records", m.get("records"))])
        )
    return lines


def _pii_line(pii: dict[str, Any]) -> str:
    """The PII manifest: profile, version, scope, counts per kind and recovery outcomes."""
    counts = " ".join(f"{k}={v}" for k, v in sorted((pii.get("counts") or {}).items())) or "none"
    recovery = " ".join(f"{k}={v}" for k, v in (pii.get("recovery") or {}).items())
    return "  " + _line(
        [
            ("pii", pii.get("profile")),
            ("detector", pii.get("detectorVersion")),
            ("scope", pii.get("scope")),
            ("replaced", counts),
            ("recovery", recovery),
        ]
    )


def _attempt_line(a: AttemptView) -> str:
    if a.incomplete:
        state = "INCOMPLETE (no attempt_finished)"
    else:
        state = _text(a.outcome)
    if a.started_at_ms is None:
        state += " (no attempt_started stored)"
    rest = _line(
        [
            ("status", a.upstream_status),
            ("error", a.error_category),
            ("connect", _ms(a.connect_ms)),
            ("first-token", _ms(a.first_token_ms)),
            ("total", _ms(a.total_ms)),
            ("reason", a.reason),
            ("route", a.route_id),
            ("deployment", a.deployment_id),
            ("model", a.physical_model),
            ("started", _at(a.started_at_ms)),
            ("finished", _at(a.finished_at_ms)),
        ]
    )
    cancelled = "  CANCELLED" if a.cancelled else ""
    return f"  attempt {a.number}  {state}{cancelled}  {rest}"


def render_view(view: RequestView) -> str:
    lines = _request_lines(view.request)
    none = "  no attempts (rejected before admission)" if view.request.rejected else "  no attempts stored"
    lines += [_attempt_line(a) for a in view.attempts] or [none]
    return "\n".join(lines)


def render_list(records: Sequence[RequestRecord]) -> str:
    header = ("ADMITTED", "REQUEST", "PRINCIPAL", "ALIAS", "STATUS", "OUTCOME", "ATTEMPTS", "TOTAL_MS", "TOKENS")
    rows = [header]
    for r in records:
        tokens = None if r.usage is None else usage_counts(r.usage).get("total")
        rows.append(
            (
                _at(r.at_ms),
                r.request_id,
                _text(r.principal_id),
                _text(r.alias),
                "INCOMPLETE" if r.incomplete else _text(r.status),
                _text(r.outcome),
                _text(r.attempt_count),
                _MISSING if r.total_ms is None else f"{r.total_ms:.1f}",
                _text(tokens),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def _as_json(item: RequestRecord | AttemptView) -> dict[str, Any]:
    rejected = {"rejected": item.rejected} if isinstance(item, RequestRecord) else {}
    return dataclasses.asdict(item) | {"incomplete": item.incomplete} | rejected


def _dump(value: object, out: TextIO) -> None:
    out.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


# ---------------------------------------------------------------- commands


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tollway audit",
        description="Read logical requests and their ordered attempts from the audit store.",
        epilog="Table: $TOLLWAY_TABLE_AUDIT, else the stage $TOLLWAY_STAGE's. Endpoint: $AWS_ENDPOINT_URL or AWS.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", help="one request and its attempts")
    show.add_argument("request_id", metavar="REQUEST_ID")
    show.add_argument("--json", action="store_true", help="print JSON")
    listing = sub.add_parser("list", help="requests admitted since a time, newest first")
    listing.add_argument("--since", required=True, metavar="DURATION|ISO", help="15m, 2h, 7d or an ISO-8601 time")
    listing.add_argument("--principal", metavar="P", help="only this principal's requests (an index query)")
    listing.add_argument("--limit", type=int, default=50, metavar="N", help=f"at most N (1-{MAX_LIST_LIMIT})")
    listing.add_argument("--json", action="store_true", help="print JSON")
    return parser


def stage_audit_table(stage: str) -> str:
    """The audit table of a stage, as ``tollway.cloud.resources.topology`` names it.

    Spelled out here because ``tollway.cloud`` is not shipped in the Lambda core layer and this
    module is; ``tests/unit/audit/test_store_cli.py`` checks the two agree.
    """
    return f"{stage or 'tollway'}-audit"


def _default_store(environ: Mapping[str, str]) -> AuditStore:
    running = None if environ.get("AWS_ENDPOINT_URL", "").strip() else read_state()
    if running is not None:
        # No endpoint given: the local cloud of the `tollway up` running in this directory.
        stage = environ.get("TOLLWAY_STAGE", "").strip() or running.stage
        environ = {
            **environ,
            "AWS_ENDPOINT_URL": running.endpoint,
            "AWS_REGION": running.region,
            "TOLLWAY_STAGE": stage,
        }
    table = environ.get("TOLLWAY_TABLE_AUDIT", "").strip()
    if not table:
        table = stage_audit_table(environ.get("TOLLWAY_STAGE", "").strip())
    settings = StoreSettings.from_env(environ, table=table)
    endpoint = settings.endpoint or ""
    if urllib.parse.urlsplit(endpoint).hostname in ("127.0.0.1", "localhost", "::1") and not environ.get(
        "AWS_ACCESS_KEY_ID"
    ):
        # The local cloud takes any credentials; a developer's shell should not need AWS ones to read it.
        import boto3

        region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        client = boto3.client(
            "dynamodb",
            endpoint_url=aws.endpoint_url(endpoint),
            region_name=region,
            aws_access_key_id="test",
            aws_secret_access_key="test",
        )
        return DynamoDBAuditStore(settings, client=client)
    return DynamoDBAuditStore(settings)


def main(argv: Sequence[str] | None = None, *, store: AuditStore | None = None, out: TextIO | None = None) -> int:
    """Run one command; ``store`` replaces the DynamoDB store of the environment (tests)."""
    parser = _parser()
    args = parser.parse_args(argv)
    out = out or sys.stdout
    since_ms = 0
    if args.command == "list":
        if not 1 <= args.limit <= MAX_LIST_LIMIT:
            parser.error(f"--limit must be 1-{MAX_LIST_LIMIT}")
        try:
            since_ms = parse_since(args.since, int(time.time() * 1000))
        except ValueError as exc:
            parser.error(str(exc))
    try:
        audit = store or _default_store(os.environ)
        if args.command == "show":
            view = audit.get_request(args.request_id)
            if view is None:
                print(f"no audit record for request {args.request_id}", file=sys.stderr)
                return 1
            if args.json:
                _dump(
                    {
                        "request": _as_json(view.request),
                        "attempts": [_as_json(a) for a in view.attempts],
                        "incomplete": view.incomplete,
                    },
                    out,
                )
            else:
                out.write(render_view(view) + "\n")
            return 0
        records = audit.list_requests(since_ms, args.principal, args.limit)
    except AuditStoreError as exc:
        print(f"tollway audit: {exc}", file=sys.stderr)
        return 1
    if args.json:
        _dump([_as_json(r) for r in records], out)
    else:
        out.write(render_list(records) + "\n")
    return 0
