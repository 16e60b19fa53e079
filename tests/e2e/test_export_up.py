"""Content capture and a governed export, as the README shows them, on ``tollway up``'s own stack.

``tollway up`` (mock providers, moto server with every resource, the event-source runner with the
dataset-export function, the gateway on the bundled example), then requests through the official
SDK to the demo's ``chat-capture-v1`` (tokenized-content, under a PII profile) and to
``chat-pii-v1`` (metadata-only), then ``tollway export create`` / ``download`` / ``content delete``
run from the same directory as a user would. The shards hold the tokenized exchange and never the
canary values; the metadata-only request contributes no content.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from tests.e2e.test_lifecycle import _banner, _stop_up
from tests.support.processes import wait_healthy

pytestmark = [pytest.mark.e2e, pytest.mark.local_cloud]

EMAIL = "grace.hopper@example.org"
CARD = "4111 1111 1111 1111"


def _tollway(cwd: Path, env: dict[str, str], *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tollway.cli", *argv], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
    )


def _until(check, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    """Poll ``check`` until it returns something truthy, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.3)


def test_captured_content_exports_as_a_verified_dataset_without_the_values(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "TOLLWAY_DEMO_KEY"}
    log = (tmp_path / "up.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tollway.cli", "up", "--port", "0", "--cloud-port", "0", "--stage", "exp"],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        lines = _banner(proc)
        base, key = lines["base URL"], lines["demo key"]
        wait_healthy(base.removesuffix("/v1") + "/healthz")
        captured: list[str] = []
        with openai.OpenAI(base_url=base, api_key=key, max_retries=0) as sdk:
            for text in (f"Mail {EMAIL} about the refund", f"Card {CARD} was charged twice"):
                resp = sdk.chat.completions.with_raw_response.create(
                    model="chat-capture-v1", messages=[{"role": "user", "content": text}]
                )
                answer = resp.parse().choices[0].message.content or ""
                assert EMAIL in answer or CARD in answer  # restored for the caller
                captured.append(resp.headers["x-request-id"])
            streamed = sdk.chat.completions.with_raw_response.create(
                model="chat-capture-v1", messages=[{"role": "user", "content": f"Stream to {EMAIL}"}], stream=True
            )
            captured.append(streamed.headers["x-request-id"])
            assert EMAIL in "".join(c.choices[0].delta.content or "" for c in streamed.parse() if c.choices)
            plain = sdk.chat.completions.with_raw_response.create(
                model="chat-pii-v1", messages=[{"role": "user", "content": f"Mail {EMAIL}"}]
            )
        plain_id = plain.headers["x-request-id"]

        # The references reach the audit table through WAL → shipper → SQS → runner → audit writer.
        def stored() -> bool:
            shown = [_tollway(tmp_path, env, "audit", "show", rid).stdout for rid in captured]
            return all("stored s3://" in s for s in shown)

        _until(stored)
        _until(lambda: "complete" in _tollway(tmp_path, env, "audit", "show", plain_id).stdout)

        created = _tollway(
            tmp_path,
            env,
            "export",
            "create",
            "--purpose",
            "evaluation",
            "--since",
            "10m",
            "--approved-by",
            "e2e-approver",
            "--timeout",
            "120",
            timeout=180,
        )
        assert created.returncode == 0, created.stdout + created.stderr
        export_id = created.stdout.split()[1]
        assert "records 3" in created.stdout, created.stdout  # two buffered and one streamed
        assert "no_content 1" in created.stdout, created.stdout  # the metadata-only request
        listed = _tollway(tmp_path, env, "export", "list")
        assert export_id in listed.stdout and "complete" in listed.stdout, listed.stdout + listed.stderr

        out = tmp_path / "dataset"
        downloaded = _tollway(tmp_path, env, "export", "download", export_id, str(out))
        assert downloaded.returncode == 0, downloaded.stderr
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["purpose"] == "evaluation" and manifest["approvals"][0]["approvedBy"] == "e2e-approver"
        rows = [json.loads(line) for shard in sorted(out.glob("*.jsonl")) for line in shard.read_text().splitlines()]
        assert sorted(r["requestId"] for r in rows) == sorted(captured)
        raw = "".join(p.read_text() for p in out.iterdir())
        # Tokenized: the canaries never left the gateway (whole values: "4111" alone occurs in hex digests).
        assert not any(c in raw for c in (EMAIL, CARD, CARD.replace(" ", "")))
        assert "[TWPII1_EMAIL_" in raw and "[TWPII1_CARD_" in raw
        assert plain_id not in raw

        # The same request again gives the same manifest: same digest, nothing new written.
        again = _tollway(tmp_path, env, "export", "show", export_id, "--json")
        assert json.loads(again.stdout)["digest"] == manifest["digest"]

        deleted = _tollway(tmp_path, env, "content", "delete", "--request", captured[0], "--reason", "e2e")
        assert deleted.returncode == 0 and "deleted 1" in deleted.stdout, deleted.stdout + deleted.stderr
        _until(lambda: "content deleted" in _tollway(tmp_path, env, "audit", "show", captured[0]).stdout)
    finally:
        _stop_up(proc)
        log.close()
    assert proc.returncode == 0, (tmp_path / "up.log").read_text()
