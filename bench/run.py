"""``python -m bench.run PROFILE [--out DIR]``: run a named profile, direct and through the gateway.

One run starts one mock provider and one gateway (measuring each one's cold start), then runs
every step of the profile against each target: ``direct`` (the mock itself, the baseline) and
``gateway`` (Tollway in front of the same mock, with the same fault prefix). A step's endpoint
kind (:mod:`bench.endpoints`) picks the gateway's path, headers and body; direct calls the mock
endpoint the gateway itself calls for that kind (Gemini's or Bedrock's, when ``gateway.provider_format``
routes the chat alias there). It writes into
``DIR`` (default ``bench/results/<profile>-<time>/``):

``manifest.json``  every input (see :mod:`bench.manifest`); written first, rewritten at the end
``results.json``   per step and target: load spec, summary, resources and raw histograms
``summary.md``     the tables; also printed to stdout
``llm-router.yml`` the gateway configuration as generated, plus ``mock.log`` and ``gateway.log``

Every load loop is bounded (rate x duration requests, each with a timeout); servers bind
127.0.0.1 only and are stopped when the run ends, however it ends.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import orjson
import yaml

from bench import manifest as mf
from bench.aggregate import comparison, pool_runs, repetition_stats
from bench.endpoints import ENDPOINTS, Endpoint, direct_kind
from bench.loadgen import LOADGEN_VERSION, LoadResult, LoadSpec, run_load
from bench.peers import PEERS, PeerError, PeerTarget, start_peer
from bench.profiles import BENCH_DIR, PAYLOAD_DIR, Profile, Step, load_payload, load_profile
from bench.pyspy import find_py_spy, start_py_spy, summarize_collapsed
from bench.report import render_summary
from bench.resources import ResourceSampler
from bench.servers import (
    ALIAS,
    ALIASES,
    BEDROCK_ENV,
    PII_KEY_ENV,
    PROVIDER_KEY_ENV,
    PROVIDER_MODEL,
    PROVIDER_MODELS,
    Server,
    deep_merge,
    fault_prefix,
    gateway_command,
    gateway_config,
    measure_first_response,
    mock_command,
    pii_vault_config,
    start_server,
)
from tollway.cloud.local import LocalCloud
from tollway.cloud.resources import Topology, topology

__all__ = ["RESULTS_SCHEMA", "main", "sweep_knee"]

RESULTS_SCHEMA: Final = "tollway-bench-results/1"
_CHAIN_MARGIN_S: Final = 1.0
"""Time for a chained pair's load processes to spawn before the first request is due."""
_COLD_BODY: Final = {"messages": [{"role": "user", "content": "cold start"}], "max_tokens": 8}


def _dumps(data: Any) -> bytes:
    return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)


def passes(summary: dict[str, Any], p99_bound_ms: float, min_success: float) -> bool:
    """A sweep point passes with success ≥ ``min_success`` and latency p99 ≤ ``p99_bound_ms``."""
    success = summary.get("success_ratio")
    p99 = summary["latency"].get("p99_ms")
    return success is not None and success >= min_success and p99 is not None and p99 <= p99_bound_ms


def sweep_knee(points: Sequence[tuple[float, bool]]) -> float | None:
    """The highest rate that passes with every lower rate passing too; None when the first fails."""
    knee = None
    for rate, ok in sorted(points):
        if not ok:
            break
        knee = rate
    return knee


class Runner:
    def __init__(self, profile: Profile, profile_file: Path, profile_sha: str, out: Path, args: argparse.Namespace):
        self.profile = profile
        self.out = out
        self.quiet: bool = args.quiet
        self.knee: float | None = args.knee or _knee_from(args.knee_from) or profile.knee_rps
        self.repeat: int = args.repeat or profile.repeat
        self.targets: list[str] = [*profile.targets, *(p for p in args.peers or () if p not in profile.targets)]
        if self.knee is None and any(s.rate_x_knee is not None for s in profile.steps):
            raise SystemExit(f"profile {profile.name} has rate_x_knee steps: pass --knee RPS or --knee-from RESULTS")
        if any(t in PEERS for t in self.targets) and any(s.endpoint != "chat" for s in profile.steps):
            raise SystemExit(
                f"profile {profile.name} calls more than the chat endpoint: peers are measured on chat only"
            )
        self.user_key = "tw-bench-" + secrets.token_urlsafe(18)
        self.provider_key = "mock-bench-" + secrets.token_urlsafe(12)
        self.pii_key = secrets.token_urlsafe(32)  # 32 random bytes; in the gateway's env whether used or not
        self.manifest: dict[str, Any] = {
            "schema": mf.MANIFEST_SCHEMA,
            "created": mf.now_utc(),
            "command": [Path(sys.executable).name, "-m", "bench.run", *sys.argv[1:]],
            "profile": {
                "name": profile.name,
                "file": _rel(profile_file),
                "sha256": profile_sha,
                "settings": profile.model_dump(mode="json"),
            },
            "git": mf.git_state(),
            "packages": mf.package_versions(),
            "machine": mf.machine(),
            "payloads": {},
            "knee_rps": self.knee,
            "repeat": self.repeat,
            "loadgen": {
                "version": LOADGEN_VERSION,
                "client_version": _client_version(profile.load.client),
                "loop": "uvloop",
                "model": "open-loop, fixed rate, latency from intended send time",
                **profile.load.model_dump(mode="json"),
            },
        }
        self.bodies: dict[tuple[str, bool, str, str, str | None], bytes] = {}
        self.py_spy: str | None = None
        if args.py_spy:
            self.py_spy = find_py_spy()
            if self.py_spy is None:
                raise SystemExit("--py-spy: no py-spy executable (pip install py-spy==0.4.3)")
        self.mock: Server | None = None
        self.gateway: Server | None = None
        self.cloud: LocalCloud | None = None
        self.kafka_pid: int | None = None
        self._exit = contextlib.ExitStack()
        self.peers: dict[str, PeerTarget] = {}
        self.failed: dict[str, str] = {}
        """Targets that could not start or died, with the reason."""
        self.sampler: ResourceSampler | None = None

    # -- set-up ---------------------------------------------------------------------------

    def _kind(self, target: str, step: Step) -> Endpoint:
        """The endpoint ``target`` is called on in ``step``: direct calls the mock endpoint behind the
        gateway's alias for it (:func:`bench.endpoints.direct_kind`)."""
        kind = ENDPOINTS[step.endpoint]
        return direct_kind(kind, self.profile.gateway.provider_format) if target == "direct" else kind

    def _body(self, payload: str, stream: bool, target: str, kind: Endpoint, alias: str | None = None) -> bytes:
        key = (payload, stream, target, kind.name, alias)
        if key not in self.bodies:
            body, sha = load_payload(payload)
            self.manifest["payloads"][payload] = {"file": _rel(PAYLOAD_DIR / f"{payload}.json"), "sha256": sha}
            model = alias if alias is not None and target == "gateway" else self._model(target, kind)
            self.bodies[key] = orjson.dumps(kind.body(body, model, stream))
            self.manifest["payloads"][payload]["request_bytes"] = len(self.bodies[key])
        return self.bodies[key]

    def _model(self, target: str, kind: Endpoint) -> str:
        if target in self.peers:
            return self.peers[target].model
        return ALIASES[kind.name] if target == "gateway" else PROVIDER_MODELS[kind.name]

    def _target(
        self, target: str, kind: Endpoint = ENDPOINTS["chat"], stream: bool = False
    ) -> tuple[str, dict[str, str]]:
        if target in self.peers:
            return self.peers[target].url, dict(self.peers[target].headers)
        if target == "gateway":
            assert self.gateway is not None
            return f"{self.gateway.url}/{kind.path}", kind.headers(self.user_key)
        assert self.mock is not None
        path = kind.url_path(PROVIDER_MODELS[kind.name], stream)
        url = f"{self.mock.url}{fault_prefix(self.profile.mock.faults)}{path}"
        return url, kind.headers(self.provider_key)

    def start(self) -> None:
        profile = self.profile
        mock_cmd = mock_command(profile.mock.workers)
        self.manifest["mock"] = {"command": _argv(mock_cmd), **profile.mock.model_dump(mode="json")}
        self._write_manifest()
        self.mock = start_server("mock", mock_cmd, r"mock listening on (\S+)", self.out / "mock.log")
        url, headers = self._target("direct")
        cold_body = orjson.dumps({"model": PROVIDER_MODEL, **_COLD_BODY})
        self.mock.cold_start = measure_first_response(self.mock, url, cold_body, headers)

        digest = hashlib.sha256(self.user_key.encode()).hexdigest()
        overrides = dict(profile.gateway.config)
        gateway_env = {PROVIDER_KEY_ENV: self.provider_key, PII_KEY_ENV: self.pii_key}
        if profile.gateway.provider_format == "bedrock-converse":
            gateway_env.update(BEDROCK_ENV)
        if profile.gateway.pii_vault:
            topo = self._start_cloud(gateway_env)
            overrides["pii"] = deep_merge({"vault": pii_vault_config(topo.prefix)}, overrides.get("pii", {}))
        if profile.gateway.audit != "off":
            if profile.gateway.audit_sink == "kafka":
                cloud_audit = self._start_kafka(profile.gateway.audit)
            else:
                topo = self._start_cloud(gateway_env)
                cloud_audit = self._audit_block(
                    profile.gateway.audit, {"type": "sqs", "queueName": topo.queue("audit").name}
                )
                self.manifest["cloud"]["durability"] = profile.gateway.audit
            # The profile's own audit: keys (commit delay, say) refine the cloud's block.
            overrides["audit"] = deep_merge(cloud_audit, overrides.get("audit", {}))
        tracing = overrides.get("telemetry", {}).get("tracing", {})
        if tracing.get("enabled") and not tracing.get("endpoint"):
            from bench.otlp_sink import OtlpSink

            self.otlp_sink = OtlpSink().__enter__()  # in this process: its CPU is not the gateway's
            tracing["endpoint"] = self.otlp_sink.endpoint
        endpoints = {step.endpoint for step in profile.steps}
        config = gateway_config(
            self.mock.url,
            profile.mock.faults,
            digest,
            overrides,
            endpoints,
            profile.gateway.extra_models,
            profile.gateway.provider_format,
        )
        pricing = config.get("governance", {}).get("pricing", {})
        if pricing.get("catalogFile"):  # a profile names it relative to bench/
            pricing["catalogFile"] = str((Path(__file__).parent / pricing["catalogFile"]).resolve())
        config_path = self.out / "llm-router.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        gw_cmd = gateway_command(config_path, profile.gateway.workers, profile.gateway.server)
        self.manifest["gateway"] = {
            "command": _argv(gw_cmd),
            "server": profile.gateway.server,
            "workers": profile.gateway.workers,
            "config_file": config_path.name,
            "config": config,
        }
        self.gateway = start_server(
            "gateway",
            gw_cmd,
            r"Tollway listening on (\S+)",
            self.out / "gateway.log",
            gateway_env,
        )
        url, headers = self._target("gateway")
        cold_body = orjson.dumps({"model": ALIAS, **_COLD_BODY})
        self.gateway.cold_start = measure_first_response(self.gateway, url, cold_body, headers)
        self.manifest["peers"] = {}
        for name in self.targets:
            if name in PEERS:
                self._start_peer(name)
        self.targets = [t for t in self.targets if t not in self.failed]
        roots = {"all": os.getpid(), "gateway": self.gateway.pid, "mock": self.mock.pid}
        if self.cloud is not None and self.cloud.proc is not None:
            roots["cloud"] = self.cloud.proc.pid
        if self.kafka_pid is not None:
            roots["kafka"] = self.kafka_pid
        roots.update({name: peer.server.pid for name, peer in self.peers.items()})
        self.sampler = ResourceSampler(roots).start()

    def _start_cloud(self, gateway_env: dict[str, str]) -> Topology:
        """moto server on a free port with the bench stage's resources (once, for the audit queue and
        the PII vault alike); adds its endpoint and credentials to ``gateway_env``."""
        from tollway.cloud.bootstrap import bootstrap
        from tollway.cloud.local import start_local_cloud

        topo = topology("bench")
        if self.cloud is None:
            self.cloud = start_local_cloud(0, log_path=self.out / "cloud.log")
            bootstrap(topo, endpoint=self.cloud.endpoint, region=self.cloud.region, env=self.cloud.env())
            self.manifest["cloud"] = {"endpoint": self.cloud.endpoint, "stage": topo.prefix}
        gateway_env.update(self.cloud.env())
        return topo

    def _start_kafka(self, durability: str) -> dict[str, object]:
        """A Tansu broker on a free loopback port with the audit topic; returns the ``audit:`` block."""
        from tests.support.kafka import create_topic, kafka_broker

        broker = self._exit.enter_context(kafka_broker(self.out / "kafka"))
        topic = "tollway-audit-bench"
        create_topic(broker.bootstrap, topic)
        self.kafka_pid = broker.proc.pid
        self.manifest["kafka"] = {"bootstrap": broker.bootstrap, "topic": topic, "durability": durability}
        return self._audit_block(durability, {"type": "kafka", "bootstrapServers": broker.bootstrap, "topic": topic})

    def _audit_block(self, durability: str, sink: dict[str, object]) -> dict[str, object]:
        """The generated config's ``audit:`` block: the WAL under the run's directory, and ``sink``."""
        spool: dict[str, object] = {"path": str(self.out / "audit-wal")}
        if durability == "local-durable":
            spool["persistenceClass"] = "persistent"
        return {"durability": durability, "spool": spool, "sink": sink}

    def _start_peer(self, name: str) -> None:
        assert self.mock is not None
        faults = self.profile.mock.faults
        try:
            peer = start_peer(name, self.out, self.mock.url, faults, self.profile.gateway.workers, self.provider_key)
        except PeerError as exc:
            self.failed[name] = str(exc)
            self.manifest["peers"][name] = {"status": "failed to start", "reason": str(exc)}
            print(f"peer {name} is not measured: {exc}", file=sys.stderr, flush=True)
            return
        self.peers[name] = peer
        cold_body = orjson.dumps({"model": peer.model, **_COLD_BODY})
        try:
            peer.server.cold_start = measure_first_response(peer.server, peer.url, cold_body, peer.headers)
        except RuntimeError as exc:
            self.failed[name] = f"started but gave no successful response: {exc}"
            self.manifest["peers"][name] = {"status": "failed", "reason": self.failed[name]}
            print(f"peer {name} is not measured: {self.failed[name]}", file=sys.stderr, flush=True)
            peer.server.stop()
            del self.peers[name]
            return
        self.manifest["peers"][name] = {
            "status": "ok",
            "version": peer.version,
            "workers": peer.workers,
            "command": _argv(peer.server.command),
            **peer.settings,
        }

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        for peer in self.peers.values():
            peer.server.stop()
        for server in (self.gateway, self.mock):
            if server is not None:
                server.stop()
        if self.cloud is not None:
            self.cloud.stop()
        self._exit.close()

    # -- measuring ------------------------------------------------------------------------

    def _check_alive(self) -> None:
        for server in (self.mock, self.gateway):
            if server is not None and server.proc.poll() is not None:
                raise RuntimeError(f"{server.name} exited with {server.proc.returncode}; see {server.log_path}")

    def _rate(self, step: Step) -> float:
        return step.rate if step.rate is not None else (step.rate_x_knee or 0) * (self.knee or 0)

    def _spec(self, target: str, step: Step, rate: float) -> LoadSpec:
        load = self.profile.load
        kind = self._kind(target, step)
        url, headers = self._target(target, kind, step.stream)
        if target == "gateway":
            headers = {**headers, **step.headers}
        warmup = step.warmup_s if step.warmup_s is not None else load.warmup_s
        return LoadSpec(
            url=url,
            body=self._body(step.payload, step.stream, target, kind, step.model),
            rate=rate,
            duration_s=step.duration_s if step.duration_s is not None else load.duration_s,
            warmup_s=0.0 if step.follows_previous else warmup,
            timeout_s=load.timeout_s,
            stream=step.stream,
            endpoint=kind.name,
            headers=headers,
            procs=load.procs,
            max_in_flight=load.max_in_flight,
            client=load.client,
            label=f"{target}/{step.name}@{rate:g}",
            progress=not self.quiet,
        )

    def measure(self, target: str, step: Step, rate: float) -> dict[str, Any]:
        self._check_alive()
        spec = self._spec(target, step, rate)
        if step.settle_s:
            time.sleep(step.settle_s)
        profiler = self._start_profiler(target, step, rate, spec)
        result = run_load(spec)
        return self._entry(target, rate, spec, result, profiler)

    def measure_chain(self, target: str, first: Step, second: Step) -> tuple[dict[str, Any], dict[str, Any]]:
        """``first`` and then ``second`` with no gap: ``second`` starts as ``first``'s window ends."""
        self._check_alive()
        if first.settle_s:
            time.sleep(first.settle_s)
        margin = _CHAIN_MARGIN_S if self.profile.load.procs > 1 else 0.2
        start = time.monotonic() + margin
        spec1 = dataclasses.replace(self._spec(target, first, self._rate(first)), start_at=start)
        start2 = start + spec1.warmup_s + spec1.duration_s
        spec2 = dataclasses.replace(self._spec(target, second, self._rate(second)), start_at=start2)
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="bench-chain") as pool:
            pending = pool.submit(run_load, spec2)
            result1 = run_load(spec1)
            result2 = pending.result(timeout=spec2.duration_s + spec2.timeout_s + 120)
        return (
            self._entry(target, spec1.rate, spec1, result1, None),
            self._entry(target, spec2.rate, spec2, result2, None),
        )

    def _entry(
        self,
        target: str,
        rate: float,
        spec: LoadSpec,
        result: LoadResult,
        profiler: tuple[subprocess.Popen[bytes], Path] | None,
    ) -> dict[str, Any]:
        summary = result.summary(spec.duration_s, spec.stream)
        resources = self._resources(result)
        sent = max(1, summary["sent"])
        servers = [name for name in ("gateway", "mock", *self.peers) if isinstance(resources.get(name), dict)]
        cpu_ms = {name: round(resources[name]["cpu_s"] * 1000 / sent, 3) for name in servers}
        if isinstance(resources.get("all"), dict) and servers:
            loadgen_s = resources["all"]["cpu_s"] - sum(resources[name]["cpu_s"] for name in servers)
            cpu_ms["loadgen"] = round(max(0.0, loadgen_s) * 1000 / sent, 3)
        if not self.quiet:
            lat = summary["latency"]
            print(
                f"  {spec.label}: {summary['completed']}/{summary['offered']} completed, "
                f"p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms, {summary['throughput_rps']} RPS",
                file=sys.stderr,
                flush=True,
            )
        self._check_alive()
        entry = {
            "target": target,
            "server_group": "mock" if target == "direct" else target,
            "rate": rate,
            "spec": spec.settings(),
            "summary": summary,
            "resources": resources,
            "cpu_ms_per_request": cpu_ms,
            "raw": result.to_dict(),
        }
        if profiler is not None:
            entry["py_spy"] = self._finish_profiler(*profiler)
        return entry

    def _start_profiler(
        self, target: str, step: Step, rate: float, spec: LoadSpec
    ) -> tuple[subprocess.Popen[bytes], Path] | None:
        if self.py_spy is None or target != "gateway" or self.gateway is None:
            return None
        output = self.out / f"{step.name}@{rate:g}.gateway.pyspy.txt"
        proc = start_py_spy(self.py_spy, self.gateway.pid, spec.warmup_s + spec.duration_s, output)
        return proc, output

    def _finish_profiler(self, proc: subprocess.Popen[bytes], output: Path) -> dict[str, Any]:
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate(timeout=5)
        if proc.returncode != 0 or not output.is_file():
            return {"file": None, "error": err.decode(errors="replace")[-500:]}
        return {"file": output.name, **summarize_collapsed(output)}

    def _resources(self, result: LoadResult) -> dict[str, Any]:
        if self.sampler is None or result.window is None:
            return {}
        self.sampler.sample_now()
        return self.sampler.window(*result.window)

    def run(self) -> dict[str, Any]:
        profile = self.profile
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {
            s.name: {t: [] for t in self.targets} for s in profile.steps
        }
        steps = profile.steps
        for repetition in range(self.repeat):
            for target in self.targets:
                for i, step in enumerate(steps):
                    if not self._peer_alive(target):
                        break
                    if step.follows_previous:
                        continue  # measured with the step before it
                    if step.rates is not None:
                        if repetition == 0:
                            runs[step.name][target].extend(self._sweep(target, step))
                        continue
                    after = steps[i + 1] if i + 1 < len(steps) and steps[i + 1].follows_previous else None
                    if after is None:
                        measured = [(step, self.measure(target, step, self._rate(step)))]
                    else:
                        pair = self.measure_chain(target, step, after)
                        measured = [(step, pair[0]), (after, pair[1])]
                    for which, entry in measured:
                        entry["repetition"] = repetition
                        runs[which.name][target].append(entry)
        assert self.mock is not None and self.gateway is not None
        return {
            "schema": RESULTS_SCHEMA,
            "profile": profile.name,
            "created": self.manifest["created"],
            "finished": mf.now_utc(),
            "repeat": self.repeat,
            "targets": self._target_status(),
            "cold_start": {
                "mock": self.mock.cold_start,
                "gateway": self.gateway.cold_start,
                **{name: peer.server.cold_start for name, peer in self.peers.items()},
            },
            "steps": [self._step_result(step, runs[step.name]) for step in profile.steps],
        }

    def _peer_alive(self, target: str) -> bool:
        peer = self.peers.get(target)
        if peer is None or peer.server.proc.poll() is None:
            return target not in self.failed
        self.failed[target] = (
            f"exited with {peer.server.proc.returncode} during the run; see {peer.server.log_path.name}"
        )
        print(f"peer {target}: {self.failed[target]}", file=sys.stderr, flush=True)
        return False

    def _target_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"direct": {"status": "ok"}, "gateway": {"status": "ok"}}
        for name, info in self.manifest.get("peers", {}).items():
            out[name] = {**info, "status": "failed" if name in self.failed else info.get("status")}
            if name in self.failed:
                out[name]["reason"] = self.failed[name]
        return out

    def _sweep(self, target: str, step: Step) -> list[dict[str, Any]]:
        """Rising rates until one fails; a sweep runs once, whatever ``repeat`` says."""
        bound = self.profile.sweep
        entries = []
        for rate in sorted(step.rates or ()):
            entry = self.measure(target, step, rate)
            entry["pass"] = passes(entry["summary"], bound.p99_bound_ms, bound.min_success)
            entries.append(entry)
            if not entry["pass"]:
                break
        return entries

    def _step_result(self, step: Step, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": step.name,
            "payload": step.payload,
            "stream": step.stream,
            "endpoint": step.endpoint,
            "direct_endpoint": self._kind("direct", step).name,
            "kind": "sweep" if step.sweep else "fixed",
            "timeline": step.timeline,
            "runs": [entry for target_runs in runs.values() for entry in target_runs],
            "comparison": [],
        }
        if step.sweep:
            out["sweep"] = self.profile.sweep.model_dump(mode="json")
            out["knee_rps"] = {
                target: sweep_knee([(e["rate"], e["pass"]) for e in entries]) for target, entries in runs.items()
            }
            direct = {e["rate"]: e["summary"] for e in runs.get("direct", [])}
            for target, entries in runs.items():
                for entry in entries if target != "direct" else ():
                    if entry["rate"] in direct:
                        base = direct[entry["rate"]]
                        out["comparison"].append(comparison(target, entry["rate"], base, entry["summary"], False))
            return out
        pooled = {target: pool_runs(entries) for target, entries in runs.items() if entries}
        out["pooled"] = pooled
        if "direct" not in pooled:
            return out
        d = pooled["direct"]
        for target, other in pooled.items():
            if target == "direct":
                continue
            out["comparison"].append(comparison(target, other["rate"], d["summary"], other["summary"], step.stream))
            if self.repeat > 1:
                out.setdefault("repetitions", {})[target] = repetition_stats(runs["direct"], runs[target], step.stream)
        return out

    def _write_manifest(self) -> None:
        (self.out / "manifest.json").write_bytes(_dumps(self.manifest))


def _knee_from(path: str | None) -> float | None:
    if not path:
        return None
    file = Path(path)
    data = orjson.loads((file / "results.json" if file.is_dir() else file).read_bytes())
    for step in data.get("steps", []):
        knee = (step.get("knee_rps") or {}).get("gateway")
        if knee:
            return float(knee)
    raise SystemExit(f"{path}: no sweep step with a gateway knee")


def _client_version(client: str) -> str:
    package = "httptools" if client == "http1" else client
    return f"{package} {mf.package_versions().get(package)}"


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(BENCH_DIR.parent))
    except ValueError:
        return str(path)


def _argv(command: Sequence[str]) -> list[str]:
    return [Path(command[0]).name, *command[1:]]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description="Run a benchmark profile.")
    parser.add_argument("profile", help="a name in bench/profiles/ (smoke, fixed-500, ...) or a .yml path")
    parser.add_argument("--out", help="output directory (default: bench/results/<profile>-<time>)")
    parser.add_argument("--knee", type=float, help="the gateway knee in RPS, for rate_x_knee steps")
    parser.add_argument("--knee-from", help="take the knee from a sweep's results.json (or its directory)")
    parser.add_argument("--repeat", type=int, choices=range(1, 11), metavar="N", help="repetitions (1-10)")
    parser.add_argument("--quiet", action="store_true", help="no per-second progress lines")
    parser.add_argument(
        "--peers",
        type=lambda text: [p for p in text.split(",") if p],
        default=[],
        help=f"also measure peer gateways, comma-separated ({','.join(PEERS)}); see bench/peers.py",
    )
    parser.add_argument(
        "--py-spy", action="store_true", help="profile the gateway during gateway runs (dev tool: py-spy==0.4.3)"
    )
    args = parser.parse_args(argv)
    unknown = [p for p in args.peers if p not in PEERS]
    if unknown:
        parser.error(f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(PEERS)}")
    try:
        profile, profile_file, profile_sha = load_profile(args.profile)
    except (OSError, ValueError) as exc:
        parser.error(f"cannot load profile {args.profile}: {exc}")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else BENCH_DIR / "results" / f"{profile.name}-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    runner = Runner(profile, profile_file, profile_sha, out, args)
    try:
        runner.start()
        results = runner.run()
    finally:
        runner.stop()
    runner.manifest["finished"] = results["finished"]
    runner._write_manifest()
    (out / "results.json").write_bytes(_dumps(results))
    summary = render_summary(runner.manifest, results)
    (out / "summary.md").write_text(summary)
    print(summary)
    print(f"results: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
