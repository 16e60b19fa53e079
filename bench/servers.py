"""The processes a run measures: the mock provider and the gateway, on 127.0.0.1 only.

Both start as real processes (``python -m tollway.mock``, ``python -m tollway.cli serve``) on
port 0; the runner reads the bound URL from the first line each prints. Start-up doubles as
the cold-start measurement: from just before ``Popen`` to the listening line, and to the first
successful (2xx) chat completion.

Each server starts in a session of its own and ``Server.stop`` ends the whole process group:
a worker or helper process the server left behind would otherwise take CPU from the next run
and hold the stdout pipe open, so that reading the log to its end never finished.
"""

from __future__ import annotations

import contextlib
import copy
import http.client
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

__all__ = [
    "ALIAS",
    "ALIASES",
    "BEDROCK_ENV",
    "BEDROCK_REGION",
    "PII_KEY_ENV",
    "PROVIDER_KEY_ENV",
    "PROVIDER_MODEL",
    "PROVIDER_MODELS",
    "Server",
    "gateway_config",
    "measure_first_response",
    "pii_vault_config",
    "start_polled",
    "start_server",
]

ALIAS: Final = "bench-v1"
PROVIDER_MODEL: Final = "mock-gpt-small"
ALIASES: Final[Mapping[str, str]] = {
    "chat": ALIAS,
    "responses": ALIAS,
    "messages": "bench-claude-v1",
    "embeddings": "bench-embed-v1",
}
"""The gateway alias each endpoint kind calls: Responses shares the chat alias (its upstream is Chat
Completions either way); messages has an Anthropic-format route; embeddings an embeddings-only alias."""
PROVIDER_MODELS: Final[Mapping[str, str]] = {
    "chat": PROVIDER_MODEL,
    "messages": "mock-claude-small",
    "embeddings": "mock-embed-small",
    "gemini": "mock-gemini-flash",
    "bedrock": "anthropic.claude-3-5-haiku-20241022-v1:0",
}
"""The model each mock endpoint is called with, by the gateway's route and by the direct baseline alike
(Bedrock's with the colon a real model id has, which both send percent-encoded in the path)."""
BEDROCK_REGION: Final = "us-east-1"
BEDROCK_ENV: Final[Mapping[str, str]] = {
    "AWS_ACCESS_KEY_ID": "bench-access-key",
    "AWS_SECRET_ACCESS_KEY": "bench-secret-key",
    "AWS_EC2_METADATA_DISABLED": "true",
}
"""The gateway's AWS credentials for a Bedrock route: dummies the mock accepts (it checks a request is
SigV4-signed, not the signature). Environment credentials come first in botocore's chain."""
PROVIDER_KEY_ENV: Final = "TOLLWAY_BENCH_PROVIDER_KEY"
PII_KEY_ENV: Final = "TOLLWAY_BENCH_PII_KEY"
"""The PII placeholder key's variable: a run always sets it (random), for profiles with ``pii:``."""
_START_TIMEOUT_S: Final = 30.0


@dataclass
class Server:
    name: str
    command: list[str]
    proc: subprocess.Popen[str]
    url: str
    log_path: Path
    started_at: float
    listening_s: float
    cold_start: dict[str, Any] = field(default_factory=dict)
    _log: IO[str] | None = None
    _drain: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s), then anything left in its process group."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        _kill_group(self.proc.pid)
        if self._drain is not None:
            self._drain.join(timeout=5)
        if self.proc.stdout is not None and (self._drain is None or not self._drain.is_alive()):
            self.proc.stdout.close()  # closing it under a blocked reader would wait for that read
        if self._log is not None and (self._drain is None or not self._drain.is_alive()):
            self._log.close()


def _kill_group(pid: int) -> None:
    """SIGKILL what is left of the process group of a server started with ``start_new_session``
    (its group id is its pid): the workers and helpers it left behind."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _pump(stream: IO[str], sink: IO[str], lines: queue.Queue[str | None], started: threading.Event) -> None:
    """Copy ``stream`` to ``sink`` line by line; until ``started`` is set, hand each line to ``lines``
    as well, and ``None`` at the end of the stream."""
    with contextlib.suppress(ValueError, OSError):
        for line in stream:
            sink.write(line)
            sink.flush()
            if not started.is_set():
                lines.put(line)
    lines.put(None)


def start_server(
    name: str, command: Sequence[str], ready: str, log_path: Path, env: Mapping[str, str] | None = None
) -> Server:
    """Start ``command`` and wait (bounded) for a stdout line matching ``ready``, whose group 1 is the URL.

    One thread reads stdout from the start into the log (a ``select`` on the pipe would miss lines
    already in the reader's buffer, when the server prints several at once).
    """
    log = log_path.open("w")
    started = time.monotonic()
    proc = subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=Path(__file__).resolve().parents[1],
        start_new_session=True,
    )
    assert proc.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()
    up = threading.Event()
    pump = threading.Thread(target=_pump, args=(proc.stdout, log, lines, up), daemon=True)
    pump.start()
    deadline = started + _START_TIMEOUT_S
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=remaining)
        except queue.Empty:
            break
        if line is None:
            break
        match = re.search(ready, line)
        if match:
            up.set()
            listening = time.monotonic() - started
            return Server(
                name, list(command), proc, match.group(1), log_path, started, listening, _log=log, _drain=pump
            )
    server = Server(name, list(command), proc, "", log_path, started, 0.0, _log=log, _drain=pump)
    server.stop()
    raise RuntimeError(f"{name} did not start within {_START_TIMEOUT_S:.0f} s; see {log_path}:\n{log_path.read_text()}")


def start_polled(
    name: str,
    command: Sequence[str],
    base_url: str,
    health_path: str,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    timeout_s: float = _START_TIMEOUT_S,
) -> Server:
    """Start ``command`` (which prints no usable ready line) and poll ``GET base_url + health_path`` until 200."""
    log = log_path.open("w")
    started = time.monotonic()
    proc = subprocess.Popen(
        list(command),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        cwd=Path(__file__).resolve().parents[1],
        text=True,
        start_new_session=True,
    )
    parts = urllib.parse.urlsplit(base_url)
    deadline = started + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=2)
        try:
            conn.request("GET", health_path)
            resp = conn.getresponse()
            resp.read()
            if resp.status == 200:
                return Server(
                    name, list(command), proc, base_url, log_path, started, time.monotonic() - started, _log=log
                )
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(0.1)
    status = f"exited with {proc.returncode}" if proc.poll() is not None else f"not healthy after {timeout_s:.0f} s"
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=5)
    _kill_group(proc.pid)
    log.close()
    tail = log_path.read_text(errors="replace")[-1500:]
    raise RuntimeError(f"{name} {status}; log tail:\n{tail}")


def measure_first_response(
    server: Server, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float = _START_TIMEOUT_S
) -> dict[str, Any]:
    """Post ``body`` until the first 2xx; the time is counted from just before the process started."""
    parts = urllib.parse.urlsplit(url)
    deadline = time.monotonic() + timeout_s
    attempts = 0
    last_error = ""
    while time.monotonic() < deadline:
        attempts += 1
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout_s)
        try:
            conn.request("POST", parts.path, body=body, headers={"content-type": "application/json", **headers})
            resp = conn.getresponse()
            resp.read()
            if 200 <= resp.status < 300:
                done = time.monotonic()
                return {
                    "listening_s": round(server.listening_s, 3),
                    "first_response_s": round(done - server.started_at, 3),
                    "attempts": attempts,
                }
            last_error = f"HTTP {resp.status}"
        except OSError as exc:
            last_error = type(exc).__name__
        finally:
            conn.close()
        if server.proc.poll() is not None:
            break
        time.sleep(0.01)
    raise RuntimeError(f"{server.name} gave no successful response ({last_error}); see {server.log_path}")


def deep_merge(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            deep_merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def fault_prefix(faults: str) -> str:
    return f"/_fault/{faults}" if faults else ""


def gateway_config(
    mock_url: str,
    faults: str,
    key_digest: str,
    overrides: Mapping[str, Any],
    endpoints: Collection[str] = ("chat",),
    extra_models: Sequence[Mapping[str, Any]] = (),
    provider_format: str = "openai-chat-completions",
) -> dict[str, Any]:
    """One alias on one mock deployment, one principal; the same fault prefix the direct target uses.

    ``endpoints`` (the profile's endpoint kinds) add what they call and nothing else, so a chat
    profile's config stays as it always was: ``messages`` an Anthropic provider on the same mock and
    an alias routed to it in its own format, ``embeddings`` an embeddings-only alias.
    ``provider_format`` ``gemini`` or ``bedrock-converse`` routes the chat alias to a provider of that
    type on the same mock instead (its only route, so every request is translated); Bedrock's signs
    with the credentials of :data:`BEDROCK_ENV`, which the run puts in the gateway's environment.
    ``extra_models`` are more aliases, each deep-merged over a copy of the chat alias after
    ``overrides`` (a list there would replace ``models`` whole) and allowed to the principal; a
    copied route's id gets the alias's name appended.
    """
    config: dict[str, Any] = {
        "maxRequestBodyBytes": 1048576,
        "requestTimeoutMs": 30000,
        "providers": {
            "mock-openai": {
                "type": "openai-compatible",
                "baseUrl": mock_url + fault_prefix(faults) + "/v1",
                "providerAccountId": "bench-account",
                "quotaGroupId": "bench-quota",
                "credentials": [{"id": "bench-provider-key", "secretRef": f"env:{PROVIDER_KEY_ENV}"}],
                "connectTimeoutMs": 2000,
                "requestTimeoutMs": 30000,
            }
        },
        "models": [
            {
                "name": ALIAS,
                "capabilities": ["streaming", "tools", "json_object", "json_schema"],
                "routes": [
                    {
                        "id": "bench-primary",
                        "provider": "mock-openai",
                        "model": PROVIDER_MODEL,
                        "providerFormat": "openai-chat-completions",
                    }
                ],
            }
        ],
        "principals": [
            {
                "id": "bench",
                "tenant": "bench",
                "allowedModels": [ALIAS],
                "keys": [{"id": "bench-key", "sha256": key_digest}],
            }
        ],
        # Observability off unless a profile turns it on (fixed-500-telemetry), so every other
        # profile stays comparable with its baseline.
        "telemetry": {"metrics": {"enabled": False}},
    }
    if provider_format != "openai-chat-completions":
        _route_chat_alias(config, provider_format, mock_url + fault_prefix(faults))
    if "messages" in endpoints:
        _add_messages_alias(config, mock_url + fault_prefix(faults))
    if "embeddings" in endpoints:
        _add_embeddings_alias(config)
    chat_alias = config["models"][0]
    deep_merge(config, overrides)
    for extra in extra_models:
        _add_alias(config, _copied_alias(chat_alias, extra))
    return config


def _copied_alias(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``extra`` over a copy of ``base``; copied routes get ids of their own (route ids are unique)."""
    alias = copy.deepcopy(dict(base))
    if "routes" not in extra:
        for route in alias["routes"]:
            route["id"] = f"{route['id']}-{extra['name']}"
    return deep_merge(alias, extra)


def pii_vault_config(prefix: str = "bench") -> dict[str, Any]:
    """``pii.vault`` on the local cloud's stage ``prefix``: its ``pii-vault`` table and KMS key, as bootstrapped."""
    from tollway.cloud.resources import topology

    topo = topology(prefix)
    return {"type": "dynamodb", "table": topo.table("pii-vault").name, "kmsKeyId": topo.kms_key("pii-vault").alias}


def _add_alias(config: dict[str, Any], model: dict[str, Any]) -> None:
    config["models"].append(model)
    config["principals"][0]["allowedModels"].append(model["name"])


def _route_chat_alias(config: dict[str, Any], provider_format: str, base_url: str) -> None:
    """Route the chat alias to a Gemini or Bedrock provider on the mock; the OpenAI provider stays,
    for the aliases other endpoint kinds add (embeddings)."""
    provider: dict[str, Any] = {
        "baseUrl": base_url,
        "providerAccountId": f"bench-account-{provider_format}",
        "quotaGroupId": f"bench-quota-{provider_format}",
        "connectTimeoutMs": 2000,
        "requestTimeoutMs": 30000,
    }
    if provider_format == "gemini":
        name, kind, capabilities = "mock-gemini", "gemini", ["streaming", "tools", "json_object", "json_schema"]
        provider |= {
            "type": "gemini",
            "credentials": [{"id": "bench-provider-key", "secretRef": f"env:{PROVIDER_KEY_ENV}"}],
        }
    elif provider_format == "bedrock-converse":
        name, kind, capabilities = "mock-bedrock", "bedrock", ["streaming", "tools"]
        provider |= {"type": "bedrock", "awsRegion": BEDROCK_REGION}
    else:
        raise ValueError(f"the chat alias cannot be routed in {provider_format!r}")
    config["providers"][name] = provider
    route = {"id": f"bench-{kind}", "provider": name, "model": PROVIDER_MODELS[kind], "providerFormat": provider_format}
    chat = config["models"][0]
    chat["capabilities"] = capabilities
    chat["routes"] = [route]


def _add_messages_alias(config: dict[str, Any], base_url: str) -> None:
    config["providers"]["mock-anthropic"] = {
        "type": "anthropic",
        "baseUrl": base_url,
        "providerAccountId": "bench-account-anthropic",
        "quotaGroupId": "bench-quota-anthropic",
        "credentials": [{"id": "bench-provider-key", "secretRef": f"env:{PROVIDER_KEY_ENV}"}],
        "connectTimeoutMs": 2000,
        "requestTimeoutMs": 30000,
    }
    route = {
        "id": "bench-anthropic",
        "provider": "mock-anthropic",
        "model": PROVIDER_MODELS["messages"],
        "providerFormat": "anthropic-messages",
    }
    _add_alias(config, {"name": ALIASES["messages"], "capabilities": ["streaming", "tools"], "routes": [route]})


def _add_embeddings_alias(config: dict[str, Any]) -> None:
    route = {
        "id": "bench-embeddings",
        "provider": "mock-openai",
        "model": PROVIDER_MODELS["embeddings"],
        "providerFormat": "openai-chat-completions",
    }
    alias = {
        "name": ALIASES["embeddings"],
        "operations": ["embeddings"],
        "clientFormats": ["openai-embeddings"],
        "routes": [route],
    }
    _add_alias(config, alias)


def mock_command(workers: int) -> list[str]:
    return [sys.executable, "-m", "tollway.mock", "--host", "127.0.0.1", "--port", "0", "--workers", str(workers)]


def gateway_command(config_path: Path, workers: int, server: str = "uvicorn") -> list[str]:
    if server == "granian":
        return [
            sys.executable,
            "-m",
            "bench.granian_gateway",
            "--config",
            str(config_path),
            "--host",
            "127.0.0.1",
            "--workers",
            str(workers),
        ]
    return [
        sys.executable,
        "-m",
        "tollway.cli",
        "serve",
        "--config",
        str(config_path),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--workers",
        str(workers),
    ]
