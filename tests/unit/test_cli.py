"""The ``tollway`` command line: names it shares with the resource spec, what it checks before
anything starts, its help and version, and the order and bounds of ``up``'s stop."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tollway import cli
from tollway.audit import cli as audit_cli
from tollway.cli import Child, local_audit_queue, local_environment, main, stage_names, stop_in_order
from tollway.cloud.resources import DEFAULT_PREFIX, topology
from tollway.up_state import STATE_FILE, UpState, read_state, remove_state, write_state

EXAMPLE = Path(cli.__file__).parent / "examples" / "llm-router.yml"


def test_local_audit_queue_is_the_specs_audit_queue() -> None:
    assert local_audit_queue(DEFAULT_PREFIX) == topology(DEFAULT_PREFIX).queue("audit").name
    assert local_audit_queue("e2e") == topology("e2e").queue("audit").name


def test_up_names_the_stages_resources_as_the_topology_does() -> None:
    for stage in (DEFAULT_PREFIX, "e2e"):
        spec = topology(stage).environment("000000000000", "us-east-1")
        for name, value in local_environment(stage).items():
            assert spec[name] == value, name
        for name, value in stage_names(stage, "000000000000", "us-east-1").items():
            assert spec[name] == value, name


# ---------------------------------------------------------------- version and help


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])

    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"tollway {importlib.metadata.version('tollway')}"


def _option_entries(help_text: str) -> dict[str, str]:
    """Each option of a ``--help`` output, by its flags, with its help text on one line."""
    entries: dict[str, str] = {}
    current = None
    for line in help_text.split("options:", 1)[1].splitlines():
        if line.startswith("  -"):
            flags, _, rest = line.strip().partition("  ")
            current = flags.split()[0].rstrip(",")
            entries[current] = rest.strip()
        elif current is not None and line.strip():
            entries[current] = (entries[current] + " " + line.strip()).strip()
    return entries


@pytest.mark.parametrize("command", ["up", "serve"])
def test_every_option_of_up_and_serve_shows_its_default(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    entries = _option_entries(capsys.readouterr().out)

    parser = next(a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    flags = {a.option_strings[0] for a in parser._actions if a.option_strings and a.dest != "help"}
    assert flags == set(entries) - {"-h"}
    for flag in flags:
        assert re.search(r"\(default: [^)]+\)$", entries[flag]), f"{command} {flag}: {entries[flag]!r}"
    if command == "up":
        assert entries["--mock-port"].endswith("(default: 0)")


# ---------------------------------------------------------------- checked before anything starts


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[list[str]]]:
    """No child process may start and nothing may listen; the environment and signals are restored.

    Yields the command lines ``subprocess.Popen`` was asked to run (it refuses them all).
    """
    started: list[list[str]] = []

    def refuse(args: list[str], *a: Any, **kw: Any) -> None:
        started.append(list(args))
        raise AssertionError(f"started {args} before its checks passed")

    def no_listen(host: str, port: int) -> None:
        raise AssertionError(f"listened on {host}:{port} before its checks passed")

    environ = dict(os.environ)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    root = logging.getLogger()
    log_handlers, log_level = list(root.handlers), root.level
    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(cli, "bind_socket", no_listen)
    monkeypatch.chdir(tmp_path)
    for name in [k for k in os.environ if k.startswith(("AWS_", "TOLLWAY_"))]:
        monkeypatch.delenv(name)
    try:
        yield started
    finally:
        os.environ.clear()
        os.environ.update(environ)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        root.handlers[:] = log_handlers  # serve and up install the JSON handler on the root logger
        root.setLevel(log_level)


def _config(tmp_path: Path, **changes: Any) -> Path:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["governance"]["pricing"]["catalogFile"] = str(EXAMPLE.parent / "pricing-catalog.json")
    data.update(changes)
    path = tmp_path / "llm-router.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def test_a_missing_secret_fails_serve_with_one_line_before_anything_listens(
    isolated: list[list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TOLLWAY_MOCK_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("TOLLWAY_MOCK_PROVIDER_KEY", "sk-provider-value-never-printed")

    status = _run(["serve", "--config", str(_config(tmp_path)), "--port", "0"])

    err = capsys.readouterr().err
    assert status == 2
    assert err.splitlines() == [
        "tollway: error: secret env:TOLLWAY_DEMO_KEY is not set or empty (principals[0].keys[0].secretRef)"
    ]
    assert "sk-provider-value-never-printed" not in err


def test_a_missing_provider_credential_is_named_by_its_path(
    isolated: list[list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TOLLWAY_MOCK_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("TOLLWAY_DEMO_KEY", "tw-demo-value")

    status = _run(["serve", "--config", str(_config(tmp_path)), "--port", "0"])

    assert status == 2
    assert capsys.readouterr().err.splitlines() == [
        "tollway: error: secret env:TOLLWAY_MOCK_PROVIDER_KEY is not set or empty"
        " (providers.mock-openai.credentials[0].secretRef)"
    ]


def test_an_invalid_config_fails_up_before_anything_starts(
    isolated: list[list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, requestTimeoutMs="soon")

    status = _run(["up", "--config", str(config), "--port", "0", "--cloud-port", "0"])

    err = capsys.readouterr().err.splitlines()
    assert status == 2
    assert err[0] == f"tollway: error: {config}: invalid configuration"
    assert any("requestTimeoutMs" in line for line in err[1:])
    assert isolated == []


def test_a_secret_the_config_of_up_needs_is_checked_before_anything_starts(
    isolated: list[list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["principals"][0]["keys"].append({"id": "ops", "secretRef": "env:TW_OPS_KEY"})

    status = _run(["up", "--config", str(_config(tmp_path, principals=data["principals"])), "--cloud-port", "0"])

    assert status == 2
    assert capsys.readouterr().err.splitlines() == [
        "tollway: error: secret env:TW_OPS_KEY is not set or empty (principals[0].keys[1].secretRef)"
    ]
    assert isolated == []


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield int(s.getsockname()[1])


@pytest.mark.parametrize("flag", ["--port", "--mock-port", "--cloud-port"])
def test_a_busy_port_fails_up_with_one_line_naming_its_flag_before_anything_starts(
    flag: str, busy_port: int, isolated: list[list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    ports = {"--port": "0", "--mock-port": "0", "--cloud-port": "0", flag: str(busy_port)}

    status = _run(["up", *(x for pair in ports.items() for x in pair)])

    assert status == 2
    assert capsys.readouterr().err.splitlines() == [
        f"tollway: error: port {busy_port} on 127.0.0.1 is in use;"
        f" choose another with {flag} ({flag} 0 picks a free one)"
    ]
    assert isolated == []


def test_two_flags_on_one_port_are_refused(isolated: list[list[str]], capsys: pytest.CaptureFixture[str]) -> None:
    status = _run(["up", "--port", "48123", "--mock-port", "48123"])

    assert status == 2
    assert capsys.readouterr().err.splitlines() == [
        "tollway: error: --port and --mock-port are both 48123; give each its own port"
    ]


@pytest.mark.parametrize("mode", [["--no-cloud"], ["--cloud-port", "0"]])
def test_up_gives_the_gateway_dummy_aws_credentials_never_the_callers(
    mode: list[str], isolated: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's Bedrock alias signs its requests to the mock: with or without the local cloud,
    the caller's own AWS credentials never reach the gateway that ``up`` starts."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA-caller-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "caller-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "caller-token")
    gateway_env: dict[str, str] = {}

    def stop_at_the_mock(port: int) -> None:
        gateway_env.update(os.environ)
        raise SystemExit(3)

    monkeypatch.setattr(cli, "_start_mock", stop_at_the_mock)

    assert _run(["up", "--port", "0", *mode]) == 3
    assert (gateway_env["AWS_ACCESS_KEY_ID"], gateway_env["AWS_SECRET_ACCESS_KEY"]) == ("test", "test")
    assert "AWS_SESSION_TOKEN" not in gateway_env


def test_serve_keeps_the_aws_credentials_it_is_given(
    isolated: list[list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "AKIA-caller-key",
        "AWS_SECRET_ACCESS_KEY": "caller-secret",
        "AWS_SESSION_TOKEN": "caller-token",
        "TOLLWAY_MOCK_URL": "http://127.0.0.1:9",
        "TOLLWAY_MOCK_PROVIDER_KEY": "mock-provider-key",
        "TOLLWAY_DEMO_KEY": "tw-demo-value",
    }.items():
        monkeypatch.setenv(name, value)
    gateway_env: dict[str, str] = {}

    def stop_at_listen(host: str, port: int, flag: str) -> None:
        gateway_env.update(os.environ)
        raise SystemExit(3)

    monkeypatch.setattr(cli, "_listen", stop_at_listen)

    assert _run(["serve", "--config", str(_config(tmp_path)), "--port", "0"]) == 3
    assert gateway_env["AWS_ACCESS_KEY_ID"] == "AKIA-caller-key"
    assert gateway_env["AWS_SESSION_TOKEN"] == "caller-token"


def test_the_example_catalog_prices_every_route_of_the_example(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every alias of the demo has a known cost, whatever provider format serves it."""
    from tollway.canonical import Usage
    from tollway.config.governance import load_pricing_files, route_prices
    from tollway.config.loader import load_config
    from tollway.pricing import Cost, price

    monkeypatch.setenv("TOLLWAY_MOCK_URL", "http://127.0.0.1:9")
    cfg = load_config(EXAMPLE)
    snapshot = load_pricing_files(cfg, EXAMPLE.parent)
    assert snapshot is not None
    routes = route_prices(cfg)
    usage = Usage(prompt_tokens=1000, completion_tokens=100)

    assert {route.provider for route in routes.values()} >= {"openai", "anthropic", "gemini", "bedrock"}
    for route_id, route in routes.items():
        cost = price(snapshot, route.provider, route.model, usage, account=route.account)
        assert isinstance(cost, Cost) and cost.amount_micro_usd > 0, route_id


def test_free_ports_are_chosen_distinct_and_a_cloud_elsewhere_needs_none() -> None:
    mock, cloud = cli.up_ports("127.0.0.1", 0, 0, 0)
    assert mock and cloud and mock != cloud
    assert cli.up_ports("127.0.0.1", 0, 0, None)[1] is None


# ---------------------------------------------------------------- the order of the stop


class FakeProcess:
    """A child as ``subprocess.Popen`` presents it, recording what was done to it."""

    def __init__(self, name: str, events: list[str], *, hangs: bool = False, on_stop: Any = None) -> None:
        self.name, self.events, self.hangs, self.on_stop = name, events, hangs, on_stop
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def terminate(self) -> None:
        self.events.append(f"terminate {self.name}")
        if self.on_stop is not None:
            self.on_stop()

    def kill(self) -> None:
        self.events.append(f"kill {self.name}")
        self.returncode = -9

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and self.hangs:
            raise subprocess.TimeoutExpired(self.name, timeout or 0)
        if self.returncode is None:
            self.returncode = 0
            self.events.append(f"exited {self.name}")
        return self.returncode


@pytest.fixture
def sigint_restored() -> Iterator[None]:
    handler = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, handler)


def _child(proc: FakeProcess, timeout_s: float = 0.01) -> Child:
    return Child(proc.name, proc, timeout_s)  # type: ignore[arg-type]


def test_children_stop_one_after_another_bounded_and_a_second_ctrl_c_does_not_cut_it_short(
    sigint_restored: None,
) -> None:
    events: list[str] = []

    def ctrl_c() -> None:
        os.kill(os.getpid(), signal.SIGINT)

    shipper = FakeProcess("shipper", events, on_stop=ctrl_c)
    cloud = FakeProcess("cloud", events, hangs=True)
    mock = FakeProcess("mock", events)

    stop_in_order([_child(shipper), _child(cloud), _child(mock)])

    assert events == [
        "terminate shipper",
        "exited shipper",
        "terminate cloud",
        "kill cloud",
        "terminate mock",
        "exited mock",
    ]


def test_children_of_up_run_in_process_groups_of_their_own(sigint_restored: None) -> None:
    """A terminal's Ctrl-C goes to its foreground process group: it must reach ``up`` alone."""
    child, url = cli._start_mock(cli.up_ports("127.0.0.1", 0, 0, None)[0])
    try:
        assert url.startswith("http://127.0.0.1:")
        assert os.getpgid(child.proc.pid) != os.getpgid(0)
    finally:
        stop_in_order([child])
    assert child.proc.returncode is not None


# ---------------------------------------------------------------- tollway audit finds the local cloud


def test_the_state_file_names_a_running_up_only(tmp_path: Path) -> None:
    mine = UpState("http://127.0.0.1:4566", "tollway", "us-east-1", os.getpid())
    write_state(mine, tmp_path)

    assert read_state(tmp_path) == mine
    remove_state(os.getpid() + 1, tmp_path)
    assert (tmp_path / STATE_FILE).exists()
    remove_state(os.getpid(), tmp_path)
    assert read_state(tmp_path) is None

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    write_state(UpState("http://127.0.0.1:4566", "tollway", "us-east-1", int(gone.stdout)), tmp_path)
    assert read_state(tmp_path) is None


def test_audit_reads_the_local_cloud_of_up_without_aws_endpoint_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write_state(UpState("http://127.0.0.1:45666", "demo", "us-east-1", os.getpid()))

    found = audit_cli._default_store({})
    explicit = audit_cli._default_store({"AWS_ENDPOINT_URL": "http://127.0.0.1:4999", "TOLLWAY_STAGE": "other"})

    assert (found.settings.endpoint, found.settings.table) == ("http://127.0.0.1:45666", "demo-audit")  # type: ignore[attr-defined]
    assert (explicit.settings.endpoint, explicit.settings.table) == ("http://127.0.0.1:4999", "other-audit")  # type: ignore[attr-defined]


def test_serve_without_aws_credentials_for_a_bedrock_provider_fails_with_one_line(
    isolated: list[list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TOLLWAY_MOCK_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("TOLLWAY_DEMO_KEY", "tw-demo-value")
    monkeypatch.setenv("TOLLWAY_MOCK_PROVIDER_KEY", "sk-provider-value")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")

    status = _run(["serve", "--config", str(_config(tmp_path)), "--port", "0"])

    assert status == 2
    assert capsys.readouterr().err.splitlines() == [
        "tollway: error: no AWS credentials found in the environment, shared files or instance role"
        " (providers.mock-bedrock)"
    ]


def test_the_sweep_removes_only_metrics_directories_of_servers_that_are_gone(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"tollway-metrics-{gone.pid}-abc123"
    live = tmp_path / f"tollway-metrics-{os.getpid()}-def456"
    unnamed = tmp_path / "tollway-metrics-x_9k2l"  # no owner in its name: never touched
    for folder in (dead, live, unnamed):
        folder.mkdir()
        (folder / "counter_1.db").write_bytes(b"\0" * 16)
    stray_file = tmp_path / "tollway-metrics-1-file"
    stray_file.write_text("not a directory")
    assert cli.sweep_metrics_dirs(tmp_path) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, unnamed.name, stray_file.name])
