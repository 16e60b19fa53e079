"""Lambda cold-start path: a fresh interpreter imports the Mangum handler and serves one event.

``python -m bench.coldstart [--runs 10]`` starts the mock provider once, then, ``--runs`` times,
a fresh Python process that does what a new Lambda execution environment does in the buffered
deployment: import ``functions.gateway.handler`` (the init phase: config load, validation,
publication) and invoke it with the Function-URL chat fixture (the first invocation). Each child
reports its own phases; the parent also times process start to exit.

Direct baseline, in the same run: a fresh process that imports only the standard library's HTTP
client and sends the same chat request straight to the mock. The report gives medians and the
spread (min, max) of each, and the heavy modules found loaded after the handler's import (boto3,
botocore, aws_cdk, moto must not be on the gateway's import path).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import yaml

ROOT: Final = Path(__file__).resolve().parents[1]
EVENT: Final = ROOT / "tests" / "events" / "function_url_chat.json"
FIXTURE_KEY: Final = "tw-fixture-key-0001"
PROVIDER_KEY_ENV: Final = "TOLLWAY_COLDSTART_PROVIDER_KEY"
HEAVY: Final = ("boto3", "botocore", "aws_cdk", "moto", "jsii", "granian", "matplotlib")

_GATEWAY_CHILD: Final = """
import json, sys, time
t0 = time.perf_counter()
from functions.gateway.handler import handler
t1 = time.perf_counter()
event = json.loads(open(sys.argv[1]).read())
resp = handler(event, None)
t2 = time.perf_counter()
heavy = sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[2].split(',')))
print(json.dumps({"import_s": t1 - t0, "invoke_s": t2 - t1, "status": resp["statusCode"], "heavy": heavy}))
"""

_DIRECT_CHILD: Final = """
import json, sys, time, urllib.request
t0 = time.perf_counter()
req = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), headers={
    "content-type": "application/json", "authorization": "Bearer " + sys.argv[3]})
with urllib.request.urlopen(req, timeout=10) as r:
    status = r.status
    r.read()
t1 = time.perf_counter()
print(json.dumps({"import_s": 0.0, "invoke_s": t1 - t0, "status": status, "heavy": []}))
"""


def _config(mock_url: str, http_client: str | None = None) -> dict[str, Any]:
    client = {"httpClient": http_client} if http_client else {}
    return {
        **client,
        "providers": {
            "mock": {
                "type": "openai-compatible",
                "baseUrl": mock_url + "/v1",
                "providerAccountId": "bench",
                "quotaGroupId": "bench",
                "credentials": [{"id": "k", "secretRef": f"env:{PROVIDER_KEY_ENV}"}],
            }
        },
        "models": [
            {
                "name": "chat-fast-v1",
                "routes": [{"id": "r", "provider": "mock", "model": "m", "providerFormat": "openai-chat-completions"}],
            }
        ],
        "principals": [
            {
                "id": "bench",
                "tenant": "bench",
                "allowedModels": ["chat-fast-v1"],
                "keys": [{"id": "k", "sha256": hashlib.sha256(FIXTURE_KEY.encode()).hexdigest()}],
            }
        ],
    }


def _child(code: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60, check=False
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"cold-start child failed ({done.returncode}): {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_s"] = wall
    return result


def _summary(rows: list[dict[str, Any]], key: str) -> str:
    values = [r[key] * 1000 for r in rows]
    return f"{statistics.median(values):.0f} ms ({min(values):.0f}-{max(values):.0f})"


def run(runs: int, http_client: str | None = None) -> dict[str, Any]:
    mock = subprocess.Popen(
        [sys.executable, "-m", "tollway.mock", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert mock.stdout is not None
        line = mock.stdout.readline().strip()
        mock_url = line.removeprefix("mock listening on ").strip()
        if not mock_url.startswith("http://127.0.0.1:"):
            raise RuntimeError(f"mock did not start: {line!r}")
        with tempfile.TemporaryDirectory() as tmp:
            config = Path(tmp) / "llm-router.yml"
            config.write_text(yaml.safe_dump(_config(mock_url, http_client)))
            env = {
                **os.environ,
                "TOLLWAY_CONFIG": str(config),
                PROVIDER_KEY_ENV: "sk-coldstart",
                "AWS_LAMBDA_FUNCTION_NAME": "tollway-gateway",
                "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'shared'}",
                "PYTHONDONTWRITEBYTECODE": "",
            }
            event = json.loads(EVENT.read_text())
            body = {**json.loads(event["body"]), "model": "m"}
            gateway: list[dict[str, Any]] = []
            direct: list[dict[str, Any]] = []
            for _ in range(runs):  # interleaved, so drift on the machine hits both alike
                gateway.append(_child(_GATEWAY_CHILD, [str(EVENT), ",".join(HEAVY)], env))
                direct.append(_child(_DIRECT_CHILD, [mock_url + "/v1/chat/completions", json.dumps(body), "x"], env))
    finally:
        mock.terminate()
        mock.wait(10)
    return {"runs": runs, "gateway": gateway, "direct": direct}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.coldstart", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="fresh processes per target (1-100)")
    parser.add_argument(
        "--http-client", choices=("h1", "aiohttp", "httpx"), default=None, help="httpClient (default: the config's)"
    )
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 100:
        parser.error("--runs must be between 1 and 100")
    result = run(args.runs, args.http_client)
    gw, direct = result["gateway"], result["direct"]
    statuses = sorted({r["status"] for r in gw + direct})
    heavy = sorted({m for r in gw for m in r["heavy"]})
    print(f"runs: {args.runs} per target; statuses {statuses}; heavy modules after import: {heavy or 'none'}")
    print("| | import (init) | first invocation | process start to exit |")
    print("|---|---|---|---|")
    gw_cells = " | ".join(_summary(gw, k) for k in ("import_s", "invoke_s", "process_s"))
    print(f"| gateway (Mangum handler) | {gw_cells} |")
    print(f"| direct to mock (urllib) | - | {_summary(direct, 'invoke_s')} | {_summary(direct, 'process_s')} |")
    return 0 if statuses == [200] and not heavy else 1


if __name__ == "__main__":
    raise SystemExit(main())
