"""``GatewayRuntime``: loading the first root from a file, reload that swaps or keeps it, and
admission reading its limits from whichever root is active.

Every deployment sends through a ``MockTransport``, so nothing connects or binds a port. The
permit pools and the queue themselves are covered in ``tests/unit/pipeline/test_admission.py``;
here they are seen through the runtime and its reloads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakes.gateway import attempts, request_context
from tests.fakes.openai_chat import completion
from tests.fakes.roots import base_url, router_config
from tests.fakes.transport import MockRequest, MockResponse, MockTransport
from tollway.canonical import CanonicalRequest, Message
from tollway.exceptions import ConfigError, Overloaded
from tollway.server.runtime import GatewayRuntime

PROVIDERS = ("p0", "p1")


def _answer(request: MockRequest) -> MockResponse:
    return completion(f"from {request.provider}")


class Mocked:
    """The runtime under test, loaded with every provider answering from one ``MockTransport``."""

    def __init__(self) -> None:
        self.transport = MockTransport(_answer)
        self._names = {base_url(p): p for p in PROVIDERS}

    def load(self, path: Path) -> GatewayRuntime:
        return GatewayRuntime.load(path, transport_factory=self.transport.factory(self._names))


@pytest.fixture
def mocked(monkeypatch: pytest.MonkeyPatch) -> Mocked:
    """``env:KEY``, the configs' credential, resolves."""
    monkeypatch.setenv("KEY", "sk-test")
    return Mocked()


Write = Callable[[dict[str, Any]], Path]


@pytest.fixture
def config_file(tmp_path: Path) -> Write:
    path = tmp_path / "llm-router.yml"

    def write(data: dict[str, Any]) -> Path:
        path.write_text(yaml.safe_dump(data))
        return path

    return write


@pytest.fixture
async def runtime(mocked: Mocked, config_file: Write) -> AsyncIterator[GatewayRuntime]:
    rt = mocked.load(config_file(router_config(0, 1, maxConcurrentRequests=1, maxConcurrentStreams=1)))
    yield rt
    await rt.aclose()


async def _ask(rt: GatewayRuntime) -> str | None:
    root = rt.holder.root
    ctx = request_context(root)
    response = await rt.gateway.complete(ctx, CanonicalRequest(messages=[Message("user", "hi")]))
    return response.content


async def test_load_publishes_the_file_as_the_first_generation(runtime: GatewayRuntime) -> None:
    root = runtime.holder.root

    assert root.generation == 1
    assert list(root.aliases) == ["a"]
    assert sorted(root.deployments) == ["p0", "p1"]
    assert (root.limits.max_concurrent_requests, root.limits.max_concurrent_streams) == (1, 1)
    transports = [root.deployments[p].transport for p in PROVIDERS]
    assert [t.provider for t in transports if isinstance(t, MockTransport)] == ["p0", "p1"]
    assert runtime.gateway.governor is not None
    assert await _ask(runtime) == "from p0"


async def test_load_of_an_invalid_file_is_fatal(mocked: Mocked, config_file: Write) -> None:
    with pytest.raises(ConfigError) as info:
        mocked.load(config_file(router_config(0, routing={"maxAttempts": 0})))
    assert [i.path for i in info.value.issues] == ["routing.maxAttempts"]
    assert mocked.transport.built == []


@pytest.mark.parametrize(
    ("text", "issue"),
    [
        pytest.param("providers: [unclosed\n", "line 2, column 1", id="yaml-syntax"),
        pytest.param(yaml.safe_dump({**router_config(0), "maxAttemps": 2}), "maxAttemps", id="unknown-key"),
        pytest.param(yaml.safe_dump(router_config(0, routing={"maxAttempts": 0})), "routing.maxAttempts", id="rule"),
    ],
)
async def test_reload_keeps_the_active_root_when_the_file_is_invalid(
    runtime: GatewayRuntime, text: str, issue: str, caplog: pytest.LogCaptureFixture
) -> None:
    active = runtime.holder.root
    runtime.config_path.write_text(text)

    with caplog.at_level(logging.ERROR, logger="tollway.runtime"):
        assert await runtime.reload() is False

    assert runtime.holder.root is active
    [record] = caplog.records
    assert record.getMessage().startswith("config reload rejected; generation 1 stays active: ")
    assert issue in record.getMessage()
    assert await _ask(runtime) == "from p0"


async def test_a_reload_that_would_turn_content_capture_on_is_rejected_until_a_restart(
    runtime: GatewayRuntime, config_file: Write, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The content writer starts with the process; a reload must not publish a plan that captures
    into nothing."""
    active = runtime.holder.root
    config_file(
        router_config(
            0,
            model={"contentMode": "tokenized-content"},
            content={"store": {"type": "memory"}},
            audit={"sink": {"type": "sqs", "queueName": "q"}, "spool": {"path": str(tmp_path / "wal")}},
        )
    )

    with caplog.at_level(logging.ERROR, logger="tollway.runtime"):
        assert await runtime.reload() is False

    assert runtime.holder.root is active
    assert "restart it to turn capture on" in caplog.records[-1].getMessage()


async def test_reload_keeps_the_active_root_when_the_file_is_gone(
    runtime: GatewayRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    active = runtime.holder.root
    runtime.config_path.unlink()

    with caplog.at_level(logging.ERROR, logger="tollway.runtime"):
        assert await runtime.reload() is False

    assert runtime.holder.root is active
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    assert "generation 1 stays active" in caplog.records[0].getMessage()


async def test_reload_swaps_in_a_valid_change_and_bumps_the_generation(
    runtime: GatewayRuntime, config_file: Write
) -> None:
    """The new root routes to p1 first; the old one, still held by requests admitted before the
    swap, is unchanged; p0's settings did not change, so its transport (its warm pool) is kept."""
    old = runtime.holder.root
    config_file(router_config(1, 0, maxConcurrentRequests=1, maxConcurrentStreams=1))

    assert await runtime.reload() is True

    new = runtime.holder.root
    assert new is not old
    assert (old.generation, new.generation) == (1, 2)
    assert new.deployments["p0"].transport is old.deployments["p0"].transport
    assert await _ask(runtime) == "from p1"
    ctx = request_context(old)
    await runtime.gateway.complete(ctx, CanonicalRequest(messages=[Message("user", "hi")]))
    assert attempts(ctx) == [("r0", "ok", None, 200)]


async def test_reload_of_an_unchanged_file_keeps_the_root(runtime: GatewayRuntime) -> None:
    active = runtime.holder.root

    assert await runtime.reload() is True

    assert runtime.holder.root is active


async def test_admission_answers_with_the_active_roots_limits_across_a_reload(
    runtime: GatewayRuntime, config_file: Write
) -> None:
    """Full pools answer with the configured ``overloadStatus``; a reload that raises the limits
    admits more at once, and the permits already taken stay counted."""
    admission = runtime.admission
    admission.acquire(runtime.holder.root)
    admission.acquire_stream(runtime.holder.root)
    with pytest.raises(Overloaded) as info:
        admission.acquire(runtime.holder.root)
    assert (info.value.status, info.value.retry_after) == (503, 1)

    config_file(router_config(0, 1, maxConcurrentRequests=2, maxConcurrentStreams=2, admission={"overloadStatus": 429}))
    assert await runtime.reload() is True
    admission.acquire(runtime.holder.root)
    admission.acquire_stream(runtime.holder.root)
    assert (admission.requests, admission.streams) == (2, 2)
    with pytest.raises(Overloaded) as info:
        admission.acquire_stream(runtime.holder.root)
    assert info.value.status == 429

    admission.release(stream=True)
    admission.release(stream=True)
    assert (admission.requests, admission.streams) == (0, 0)


async def test_a_released_stream_hands_its_request_permit_to_the_oldest_waiter(
    runtime: GatewayRuntime, config_file: Write
) -> None:
    """The stream permit goes back to the pool; the request permit moves to the first request
    queued for one, which is admitted without the count ever passing the limit."""
    config_file(
        router_config(0, 1, maxConcurrentRequests=1, admission={"maxQueuedRequests": 2, "maxQueueWaitMs": 5000})
    )
    assert await runtime.reload() is True
    root, admission = runtime.holder.root, runtime.admission
    await admission.enter(root)
    admission.acquire_stream(root)
    first = asyncio.ensure_future(admission.enter(root))
    second = asyncio.ensure_future(admission.enter(root))
    async with asyncio.timeout(5):
        while len(admission._waiting) < 2:
            await asyncio.sleep(0)

    admission.release(stream=True)
    await asyncio.wait_for(first, 5)

    assert not second.done()
    assert (admission.requests, admission.streams) == (1, 0)
    admission.release(stream=False)
    await asyncio.wait_for(second, 5)
    admission.release(stream=False)
    assert admission.requests == 0


async def test_a_reload_publishes_off_the_loop_and_close_waits_for_a_cancelled_one(
    mocked: Mocked, config_file: Write
) -> None:
    """Publication blocks (credential chains, token and secret fetches), so it runs in a thread:
    requests go on meanwhile. A reload cancelled while it runs leaves it to finish, and ``aclose``
    waits for it, so the transports it built are closed with the rest."""
    rt = mocked.load(config_file(router_config(0, 1)))
    gate, building = threading.Event(), threading.Event()
    threads: list[int] = []
    build = rt.publisher.transport_factory

    def held(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        building.set()
        gate.wait(10)
        return build(*args, **kwargs)

    rt.publisher.transport_factory = held
    changed = router_config(0, 1)
    changed["providers"]["p1"]["requestTimeoutMs"] = 12345  # p1's transport is built again
    config_file(changed)
    reload = asyncio.ensure_future(rt.reload())
    closing: asyncio.Future[None] | None = None
    try:
        assert await asyncio.to_thread(building.wait, 10)
        assert threads == [threads[0]] and threads[0] != threading.get_ident()
        assert await _ask(rt) == "from p0", "served while the publication is held"
        reload.cancel()
        closing = asyncio.ensure_future(rt.aclose())
        for _ in range(20):
            await asyncio.sleep(0)
        assert not closing.done(), "aclose waits for the publication it would otherwise leak"
    finally:
        gate.set()
    await closing
    assert len(mocked.transport.built) == 3 and all(t.closed for t in mocked.transport.built)


async def test_a_rejected_publication_closes_what_it_built_and_keeps_the_warm_transports(
    runtime: GatewayRuntime, mocked: Mocked, config_file: Write
) -> None:
    """p0's settings change, then p1's credential does not resolve: publication fails after building
    p0 a new transport. That one is closed, and p0's cache slot is the active transport again, so a
    later reload that leaves p0 as it is keeps its warm pool."""
    active = runtime.holder.root
    warm = active.deployments["p0"].transport
    failing = router_config(0, 1, maxConcurrentRequests=1, maxConcurrentStreams=1)
    failing["providers"]["p0"]["requestTimeoutMs"] = 12345
    failing["providers"]["p1"]["credentials"] = [{"id": "c1", "secretRef": "env:TOLLWAY_TEST_UNSET_SECRET"}]
    config_file(failing)
    built = len(mocked.transport.built)

    assert await runtime.reload() is False

    assert runtime.holder.root is active
    (discarded,) = mocked.transport.built[built:]
    assert discarded.closed and not warm.closed  # type: ignore[attr-defined]
    config_file(router_config(1, 0, maxConcurrentRequests=1, maxConcurrentStreams=1))  # p0 unchanged
    assert await runtime.reload() is True
    assert runtime.holder.root.deployments["p0"].transport is warm
    assert len(mocked.transport.built) == built + 1
