"""The Vertex AI signer against a real service account key and a local token endpoint: it fetches
a token by the JWT bearer grant, caches it, refreshes it ahead of expiry in the background without
making a request wait, and waits only when it holds no valid token. Time is an injected clock."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.google_token import ServiceAccount
from tollway.exceptions import ConfigError, UpstreamCategory, UpstreamError
from tollway.providers.gemini.vertex_auth import VertexTokenSigner, google_credentials

URL = "https://us-central1-aiplatform.googleapis.com/v1/projects/p/locations/us-central1/publishers/google/models/m:generateContent"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def account(tmp_path: Path) -> Iterator[ServiceAccount]:
    with ServiceAccount(tmp_path) as sa:
        yield sa


def sign(signer: VertexTokenSigner) -> str:
    return signer("POST", URL, {"content-type": "application/json"}, b"{}")["authorization"]


def settle(signer: VertexTokenSigner) -> None:
    """Wait for a background refresh in flight, if any (the test's only wait on real time)."""
    future = signer._flight.inflight
    if future is not None:
        future.exception(timeout=10)


def signer_for(account: ServiceAccount, clock: Clock, **kw: Any) -> VertexTokenSigner:
    return VertexTokenSigner(google_credentials(str(account.key_file), path="providers.vertex"), clock=clock, **kw)


def test_a_token_is_fetched_once_and_reused_while_valid(account: ServiceAccount) -> None:
    clock = Clock()
    signer = signer_for(account, clock)
    signer.prime()
    assert account.endpoint.issued == ["ya29.test-token-1"]
    assert signer.expires_at == pytest.approx(clock.now + 3600, abs=5)
    for _ in range(5):
        clock.now += 60
        assert sign(signer) == "Bearer ya29.test-token-1"
    assert account.endpoint.issued == ["ya29.test-token-1"], "no second grant while the token is fresh"


def test_within_five_minutes_of_expiry_the_refresh_runs_in_the_background(account: ServiceAccount) -> None:
    clock = Clock()
    signer = signer_for(account, clock)
    signer.prime()
    clock.now += 3600 - 299
    gate = threading.Event()
    original = account.endpoint.grant

    def slow_grant(form: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        gate.wait(10)
        return original(form)

    account.endpoint.grant = slow_grant  # type: ignore[method-assign]
    assert sign(signer) == "Bearer ya29.test-token-1", "the request is signed with the old, still valid token"
    assert sign(signer) == "Bearer ya29.test-token-1", "and so is the next, while one refresh is in flight"
    assert signer._flight.inflight is not None
    gate.set()
    settle(signer)
    assert account.endpoint.issued == ["ya29.test-token-1", "ya29.test-token-2"]
    assert sign(signer) == "Bearer ya29.test-token-2"
    assert signer.expires_at == pytest.approx(clock.now + 3600, abs=5)


def test_an_expired_token_is_replaced_before_the_request_is_signed(account: ServiceAccount) -> None:
    clock = Clock()
    signer = signer_for(account, clock)
    signer.prime()
    clock.now += 3601
    assert sign(signer) == "Bearer ya29.test-token-2"


def test_without_a_token_the_first_request_waits_for_one(account: ServiceAccount) -> None:
    signer = signer_for(account, Clock())
    assert sign(signer) == "Bearer ya29.test-token-1"


async def test_ready_waits_without_blocking_the_event_loop(account: ServiceAccount) -> None:
    signer = signer_for(account, Clock())
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await signer.ready()
    task.cancel()
    assert ticks > 0
    assert sign(signer) == "Bearer ya29.test-token-1"


def test_a_failed_background_refresh_keeps_the_valid_token_and_is_retried(account: ServiceAccount) -> None:
    clock = Clock()
    signer = signer_for(account, clock)
    signer.prime()
    account.endpoint.fail = True
    clock.now += 3600 - 200
    assert sign(signer) == "Bearer ya29.test-token-1"
    settle(signer)
    assert sign(signer) == "Bearer ya29.test-token-1"
    assert signer._flight.inflight is None, "no retry within ten seconds of a failure"
    account.endpoint.fail = False
    clock.now += 11
    assert sign(signer) == "Bearer ya29.test-token-1"
    settle(signer)
    assert sign(signer) == "Bearer ya29.test-token-2"


def test_no_token_at_all_fails_as_authentication_without_the_secret(account: ServiceAccount) -> None:
    account.endpoint.fail = True
    signer = signer_for(account, Clock())
    with pytest.raises(UpstreamError) as info:
        sign(signer)
    assert info.value.category is UpstreamCategory.AUTHENTICATION
    assert "RefreshError" in str(info.value.detail)
    assert "account disabled" not in str(info.value.detail)


def test_the_token_is_in_no_repr(account: ServiceAccount) -> None:
    signer = signer_for(account, Clock())
    signer.prime()
    assert "ya29" not in repr(signer)
    assert "ya29" not in repr(signer._token)
    assert account.private_pem[40:80] not in repr(signer)


def test_a_grant_signed_by_another_key_is_refused(tmp_path: Path, account: ServiceAccount) -> None:
    (tmp_path / "other").mkdir()
    with ServiceAccount(tmp_path / "other") as other:
        other.key_file.write_text(other.key_file.read_text().replace(other.endpoint.url, account.endpoint.url))
        with pytest.raises(UpstreamError):
            sign(signer_for(other, Clock()))
    assert account.endpoint.refused and not account.endpoint.issued


def test_the_key_file_comes_from_google_application_credentials(
    account: ServiceAccount, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(account.key_file))
    signer = VertexTokenSigner(google_credentials(), clock=Clock())
    assert sign(signer) == "Bearer ya29.test-token-1"


def test_unreadable_credentials_fail_publication_at_the_provider(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"type": "service_account", "private_key": "not a key"}')
    with pytest.raises(ConfigError) as info:
        google_credentials(str(broken), path="providers.vertex")
    assert [i.path for i in info.value.issues] == ["providers.vertex"]
    assert "not a key" not in info.value.issues[0].message


def test_after_a_failed_refresh_a_request_fails_at_once_until_the_retry_window_passes(
    account: ServiceAccount,
) -> None:
    """A token endpoint that is down must not hold the event loop: with no valid token and a refresh
    that failed under ten seconds ago, signing raises without asking the endpoint again."""
    clock = Clock()
    account.endpoint.fail = True
    signer = signer_for(account, clock)
    with pytest.raises(UpstreamError):
        sign(signer)  # the first refresh, waited for, fails
    asked = account.endpoint.requests
    for _ in range(5):
        with pytest.raises(UpstreamError) as info:
            sign(signer)
        assert info.value.category is UpstreamCategory.AUTHENTICATION
        assert "refresh failed" in str(info.value.detail)
    assert account.endpoint.requests == asked, "no grant asked for within the retry window"
    account.endpoint.fail = False
    clock.now += 11
    assert sign(signer) == "Bearer ya29.test-token-1"


async def test_every_transport_awaits_the_signers_readiness_before_signing(account: ServiceAccount) -> None:
    from tollway.transport import TransportSettings, build_transport

    clock = Clock()
    signer = signer_for(account, clock)
    settings = TransportSettings(
        base_url="http://127.0.0.1:9/", connect_timeout_s=0.5, request_timeout_s=1.0, stream_idle_timeout_s=1.0
    )
    for client in ("h1", "aiohttp", "httpx"):
        transport = build_transport(client, settings, {}, signer=signer)  # type: ignore[arg-type]
        try:
            assert transport._ready is not None  # type: ignore[attr-defined]
            await transport._ready()  # type: ignore[attr-defined]
            assert signer.expires_at is not None, client
        finally:
            await transport.aclose()
