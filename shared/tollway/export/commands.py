"""``tollway export …`` and ``tollway content delete …``: the operator's side of exports and content.

- ``export create --purpose P --since 7d [--until T] [--alias A …] [--tenant T …] [--principal P …]
  [--outcome O …] [--tool-calls keep|drop] [--pii keep-tokenized|redact] --approved-by NAME``:
  enqueue an export request on the exports queue and follow it until its manifest is stored,
  with a progress line (shards written) and then the manifest's counts.
- ``export list``, ``export show ID [--json]`` (the manifest, verified against its digest),
  ``export download ID DIR`` (the manifest and every shard, each verified before it is kept).
- ``content delete (--request ID … | --before DATE) --reason TEXT``: delete captured content and
  record who deleted it, when and why in each request's audit record.

The resources come from the environment (``TOLLWAY_QUEUE_EXPORTS``, ``TOLLWAY_BUCKET_EXPORTS``,
``TOLLWAY_BUCKET_CONTENT``, ``TOLLWAY_CONTENT_KMS_KEY_ID``, ``TOLLWAY_TABLE_AUDIT``,
``TOLLWAY_QUEUE_AUDIT``); ``tollway`` fills them in for the local cloud of a running ``tollway up``.
Exit status: 0, 1 when the export or a resource fails, 2 for usage errors.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import orjson

from tollway.exceptions import TollwayError

__all__ = ["content_main", "export_main"]


def _since_ms(text: str, now_ms: int) -> int:
    from tollway.audit.cli import parse_since

    return parse_since(text, now_ms)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "operator"


def _export_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tollway export", description="Governed dataset exports (docs/export.md).")
    sub = parser.add_subparsers(dest="command", required=True)
    create = sub.add_parser("create", help="request an export and follow it until its manifest is stored")
    create.add_argument("--purpose", required=True, choices=["audit", "evaluation", "training"])
    create.add_argument("--since", required=True, help="start of the source range: 7d, 2h, or an ISO-8601 time")
    create.add_argument("--until", help="end of the source range, exclusive (default: now)")
    for name in ("alias", "tenant", "principal", "outcome"):
        create.add_argument(f"--{name}", action="append", default=[], help=f"only this {name} (repeatable)")
    create.add_argument("--tool-calls", choices=["keep", "drop"], default="keep")
    create.add_argument("--pii", choices=["keep-tokenized", "redact"], default="keep-tokenized")
    create.add_argument("--approved-by", required=True, help="who approved this export (recorded in the manifest)")
    create.add_argument("--requested-by", default=None, help="who asks (default: the current user)")
    create.add_argument("--export-id", default="", help="an id of your own (default: derived from the request)")
    create.add_argument("--shard-records", type=int, default=1000)
    create.add_argument("--timeout", type=float, default=900.0, help="seconds to follow it (the export goes on)")
    create.add_argument("--no-wait", action="store_true", help="enqueue and return")
    sub.add_parser("list", help="every export in the exports bucket")
    show = sub.add_parser("show", help="an export's manifest, verified against its digest")
    show.add_argument("export_id")
    show.add_argument("--json", action="store_true")
    download = sub.add_parser("download", help="the manifest and shards, each verified, into a folder")
    download.add_argument("export_id")
    download.add_argument("directory", type=Path)
    return parser


def export_main(argv: Sequence[str], environ: Mapping[str, str], out: TextIO = sys.stdout) -> int:
    from tollway.export import ExportError, S3ExportSink

    args = _export_parser().parse_args(list(argv))
    try:
        sink = S3ExportSink.from_env(environ)
        if args.command == "create":
            return _create(args, environ, sink, out)
        if args.command == "list":
            from tollway.export.cli import list_exports

            rows = list_exports(sink)
            for row in rows:
                state = "complete" if row["complete"] else "running"
                extra = f"  {row.get('purpose', '-')}  records {row.get('records', '-')}" if row["complete"] else ""
                print(f"{row['exportId']}  {state}  shards {row['shards']}{extra}", file=out)
            if not rows:
                print("no exports", file=out)
            return 0
        from tollway.export.cli import download, show

        if args.command == "show":
            manifest = show(sink, args.export_id)
            if args.json:
                print(orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode(), file=out)
            else:
                _summary(manifest, out)
            return 0
        for path in download(sink, args.export_id, args.directory):
            print(path, file=out)
        return 0
    except (ExportError, TollwayError) as exc:
        print(f"tollway export: {exc}", file=sys.stderr)
        return 1


def _create(args: argparse.Namespace, environ: Mapping[str, str], sink: Any, out: TextIO) -> int:
    from tollway.export import ExportRequest, InvalidExportRequest, SqsExportQueue
    from tollway.export.cli import create

    now_ms = int(time.time() * 1000)
    try:
        since_ms = _since_ms(args.since, now_ms)
        until_ms = _since_ms(args.until, now_ms) if args.until else now_ms
        request = ExportRequest.parse(
            {
                "exportId": args.export_id,
                "purpose": args.purpose,
                "sinceMs": since_ms,
                "untilMs": until_ms,
                "filters": {
                    "tenants": args.tenant,
                    "aliases": args.alias,
                    "principals": args.principal,
                    "outcomes": args.outcome,
                },
                "transformations": {"toolCalls": args.tool_calls, "pii": args.pii},
                "requestedBy": args.requested_by or _user(),
                "approvedBy": args.approved_by,
                "shardRecords": args.shard_records,
            }
        )
    except (ValueError, InvalidExportRequest) as exc:
        print(f"tollway export create: {exc}", file=sys.stderr)
        return 2
    queue = SqsExportQueue.from_env(environ)
    timeout = 0.0 if args.no_wait else args.timeout
    for status in create(request, queue, sink, timeout_s=timeout):
        if status.state == "queued":
            print(f"export {status.export_id} queued (message {status.message_id})", file=out)
            if args.no_wait:
                return 0
        elif status.state == "progress":
            c = status.counts or {}
            counts = (
                f"{c.get('phase', 'running')}: scanned {c.get('scanned', 0)}, matched {c.get('matched', 0)}, "
                f"included {c.get('records', 0)}, excluded {c.get('excluded', 0)}, "
                if c
                else "waiting for the function: "
            )
            print(f"export {status.export_id}: {counts}{status.shards} shard(s) written", file=out)
        elif status.state == "timeout":
            print(f"export {status.export_id}: still running; see `tollway export show {status.export_id}`", file=out)
            return 1
        elif status.manifest is not None:
            _summary(status.manifest, out)
    return 0


def _summary(manifest: Mapping[str, Any], out: TextIO) -> None:
    exclusions = ", ".join(f"{k} {v}" for k, v in sorted(manifest["exclusions"].items()) if v) or "none"
    source = manifest["source"]
    print(f"export {manifest['exportId']}  purpose {manifest['purpose']}  digest {manifest['digest']}", file=out)
    print(
        f"  source: {source['scanned']} scanned, {source['matched']} matched; records {manifest['records']}; "
        f"excluded: {exclusions}",
        file=out,
    )
    for shard in manifest["shards"]:
        print(f"  shard {shard['key']}  {shard['records']} records  sha256 {shard['sha256']}", file=out)


def _content_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tollway content", description="Captured content (docs/export.md).")
    sub = parser.add_subparsers(dest="command", required=True)
    delete = sub.add_parser("delete", help="delete captured content, with evidence in the audit trail")
    which = delete.add_mutually_exclusive_group(required=True)
    which.add_argument("--request", action="append", help="a request id (repeatable)")
    which.add_argument("--before", help="every request before this time: ISO-8601, or a duration back from now")
    delete.add_argument("--reason", required=True, help="why (recorded with the deletion)")
    delete.add_argument("--deleted-by", default=None, help="who (default: the current user)")
    return parser


def content_main(argv: Sequence[str], environ: Mapping[str, str], out: TextIO = sys.stdout) -> int:
    from tollway.audit.store import DynamoDBAuditStore, StoreSettings
    from tollway.content import ContentStoreSettings, S3ContentStore
    from tollway.export.audit import SqsExportAudit
    from tollway.export.deletion import delete_content, records_before

    args = _content_parser().parse_args(list(argv))
    try:
        audit_store = DynamoDBAuditStore(StoreSettings.from_env(environ))
        if args.request:
            records = []
            for request_id in args.request:
                view = audit_store.get_request(request_id)
                if view is None:
                    print(f"tollway content delete: request {request_id} is not in the audit store", file=sys.stderr)
                    return 1
                records.append(view.request)
        else:
            records = list(records_before(audit_store, _since_ms(args.before, int(time.time() * 1000))))
        store = S3ContentStore(ContentStoreSettings.from_env(environ))

        async def run() -> Any:
            try:
                return await delete_content(
                    records,
                    store,
                    SqsExportAudit.from_env(environ),
                    deleted_by=args.deleted_by or _user(),
                    reason=args.reason,
                )
            finally:
                await store.aclose()

        report = asyncio.run(run())
    except (TollwayError, ValueError) as exc:
        print(f"tollway content delete: {exc}", file=sys.stderr)
        return 1
    print(
        f"deleted {report.deleted}, already gone {report.missing}, skipped {report.skipped} "
        "(no content, or deleted before); the audit trail records each",
        file=out,
    )
    return 0
