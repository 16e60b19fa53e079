from __future__ import annotations

import asyncio
import hashlib
import hmac
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from unittest import mock
from urllib.parse import quote, urlsplit

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, RefreshableCredentials

from tollway.config.root import _prime_aws
from tollway.exceptions import ConfigError, UpstreamCategory, UpstreamError
from tollway.transport import sigv4
from tollway.transport.sigv4 import AwsCredentials, RequestSigner, botocore_credentials

SUITE_KEYS = AwsCredentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
SUITE_TIME = datetime(2015, 8, 30, 12, 36, 0, tzinfo=UTC)
NOW = datetime(2026, 12, 2, 13, 45, 17, tzinfo=UTC)
TEMPORARY = AwsCredentials(
    "ASIAEXAMPLEEXAMPLE12", "c2VjcmV0LWZvci10ZXN0cy1vbmx5LW5vdC1yZWFs", "IQoJb3JpZ2luX2VjEXAMPLE//token"
)
URL = "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse"
BODY = b'{"messages":[{"role":"user","content":[{"text":"Hi"}]}]}'
JSON = {"content-type": "application/json"}


def signer(creds: AwsCredentials = TEMPORARY, when: datetime = NOW, region: str = "us-east-1") -> RequestSigner:
    return RequestSigner(lambda: creds, region, clock=lambda: when)


@pytest.mark.parametrize(
    ("method", "signature"),
    [
        ("GET", "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
        ("POST", "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"),
    ],
    ids=["get-vanilla", "post-vanilla"],
)
def test_the_aws_test_suite_vectors_sign_as_published(method: str, signature: str) -> None:
    s = RequestSigner(lambda: SUITE_KEYS, "us-east-1", "service", clock=lambda: SUITE_TIME)
    headers = s(method, "https://example.amazonaws.com/", {}, b"")
    assert headers == {
        "x-amz-date": "20150830T123600Z",
        "authorization": "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        f"SignedHeaders=host;x-amz-date, Signature={signature}",
    }


def test_signatures_equal_botocores_own_signing_of_the_same_request() -> None:
    ours = signer()("POST", URL, JSON, BODY)
    request = AWSRequest(method="POST", url=URL, data=BODY, headers=dict(JSON))
    with mock.patch("botocore.auth.get_current_datetime", return_value=NOW):
        SigV4Auth(Credentials(*TEMPORARY), "bedrock", "us-east-1").add_auth(request)
    assert ours == {
        "x-amz-date": request.headers["X-Amz-Date"],
        "x-amz-security-token": request.headers["X-Amz-Security-Token"],
        "authorization": request.headers["Authorization"],
    }


def reference_signature(creds: AwsCredentials, url: str, headers: dict[str, str], body: bytes, when: datetime) -> str:
    """SigV4 written out from AWS's specification, without botocore: what the signer must agree with."""
    stamp = when.strftime("%Y%m%dT%H%M%SZ")
    parts = urlsplit(url)
    signed = {k.lower(): v.strip() for k, v in headers.items()} | {"host": parts.netloc, "x-amz-date": stamp}
    if creds.token:
        signed["x-amz-security-token"] = creds.token
    names = sorted(signed)
    canonical = "\n".join(
        [
            "POST",
            quote(parts.path, safe="/~"),
            "",
            "".join(f"{n}:{signed[n]}\n" for n in names),
            ";".join(names),
            hashlib.sha256(body).hexdigest(),
        ]
    )
    scope = f"{stamp[:8]}/us-east-1/bedrock/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    key = f"AWS4{creds.secret_key}".encode()
    for part in (stamp[:8], "us-east-1", "bedrock", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def test_the_model_ids_escapes_are_signed_encoded_once_more() -> None:
    """AWS signs the path URI-encoded again (``%3A`` as ``%253A``) for every service but S3."""
    headers = signer()("POST", URL, JSON, BODY)
    assert headers["authorization"].endswith("Signature=" + reference_signature(TEMPORARY, URL, JSON, BODY, NOW))
    unescaped = signer()("POST", URL.replace("%3A", ":"), JSON, BODY)
    assert unescaped["authorization"] != headers["authorization"]


def test_a_session_token_is_sent_and_signed_only_for_temporary_credentials() -> None:
    temporary = signer()("POST", URL, JSON, BODY)
    assert temporary["x-amz-security-token"] == TEMPORARY.token
    assert "SignedHeaders=content-type;host;x-amz-date;x-amz-security-token," in temporary["authorization"]
    permanent = signer(AwsCredentials(TEMPORARY.access_key, TEMPORARY.secret_key))("POST", URL, JSON, BODY)
    assert set(permanent) == {"x-amz-date", "authorization"}
    assert "SignedHeaders=content-type;host;x-amz-date," in permanent["authorization"]


def test_headers_proxies_rewrite_are_left_unsigned() -> None:
    headers = {**JSON, "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "User-Agent": "x"}
    signed = signer()("POST", URL, headers, BODY)
    assert signed == signer()("POST", URL, JSON, BODY)


def test_each_request_reads_the_current_credentials_and_time() -> None:
    current = [TEMPORARY]
    clock = [NOW]
    s = RequestSigner(lambda: current[0], "eu-west-1", clock=lambda: clock[0])
    first = s("POST", URL, JSON, BODY)
    current[0] = AwsCredentials("ASIAROTATEDEXAMPLE12", "rotated-secret", "rotated-token")
    clock[0] = NOW + timedelta(days=1)
    second = s("POST", URL, JSON, BODY)
    assert "Credential=ASIAEXAMPLEEXAMPLE12/20261202/eu-west-1/bedrock/aws4_request" in first["authorization"]
    assert "Credential=ASIAROTATEDEXAMPLE12/20261203/eu-west-1/bedrock/aws4_request" in second["authorization"]
    assert second["x-amz-security-token"] == "rotated-token"


def test_a_clock_in_another_zone_signs_in_utc() -> None:
    local = NOW.astimezone(timezone(timedelta(hours=-8)))
    assert signer(when=local)("POST", URL, JSON, BODY) == signer()("POST", URL, JSON, BODY)


def test_the_body_is_part_of_the_signature() -> None:
    assert (
        signer()("POST", URL, JSON, BODY)["authorization"] != signer()("POST", URL, JSON, BODY + b" ")["authorization"]
    )


def test_reprs_show_no_secret() -> None:
    assert TEMPORARY.secret_key not in repr(TEMPORARY)
    assert TEMPORARY.token is not None and TEMPORARY.token not in repr(TEMPORARY)
    assert "us-east-1" in repr(signer())


@pytest.fixture
def isolated_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """botocore's chain with no real configuration and no instance metadata endpoint to call."""
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    return tmp_path


def test_botocore_credentials_come_from_the_environment(isolated_aws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEMPORARY.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEMPORARY.secret_key)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TEMPORARY.token or "")
    assert botocore_credentials()() == TEMPORARY


def test_botocore_credentials_come_from_a_named_profile(isolated_aws: Path) -> None:
    (isolated_aws / "credentials").write_text(
        "[bedrock]\naws_access_key_id = AKIDPROFILEEXAMPLE12\naws_secret_access_key = profile-secret\n"
    )
    assert botocore_credentials("bedrock")() == AwsCredentials("AKIDPROFILEEXAMPLE12", "profile-secret", None)


def test_no_credentials_anywhere_is_a_config_error(isolated_aws: Path) -> None:
    with pytest.raises(ConfigError) as info:
        botocore_credentials(path="providers.bedrock")
    assert info.value.issues[0].path == "providers.bedrock"


# --- temporary credentials, refreshed off the event loop ------------------------------------------


class _Role:
    """A role's credentials endpoint for botocore's ``RefreshableCredentials``: each refresh hands out
    the next key, valid an hour from the test's clock; it records the thread that called it and can
    be held (``gate``) or made to fail."""

    def __init__(self, clock: list[datetime]) -> None:
        self.clock = clock
        self.threads: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False

    def __call__(self) -> dict[str, str]:
        self.threads.append(threading.get_ident())
        assert self.gate.wait(10), "the test never released the refresh"
        if self.fail:
            raise ConnectionError("the role's endpoint is down")
        return {
            "access_key": f"ASIAREFRESHED{len(self.threads):07d}",
            "secret_key": "refreshed-secret",
            "token": "refreshed-token",
            "expiry_time": (self.clock[0] + timedelta(hours=1)).isoformat(),
        }


def _refreshable(
    expires_in: timedelta, *, prime: bool = True
) -> tuple[sigv4._OffLoopCredentials, _Role, list[datetime]]:
    """Credentials expiring ``expires_in`` from the test's clock, which both botocore and the
    provider read (moving it moves both); primed as publication primes them, unless ``prime`` is false."""
    clock = [NOW]
    role = _Role(clock)
    found = RefreshableCredentials(
        TEMPORARY.access_key,
        TEMPORARY.secret_key,
        TEMPORARY.token,
        NOW + expires_in,
        role,
        "assume-role",
        time_fetcher=lambda: clock[0],
    )
    credentials = sigv4._OffLoopCredentials(found, clock=lambda: clock[0].timestamp())
    if prime:
        credentials.prime()
    return credentials, role, clock


async def _settled(credentials: sigv4._OffLoopCredentials, want: str) -> AwsCredentials:
    """The credentials once the refresh in its thread has handed out ``want`` (5 s deadline)."""
    deadline = time.monotonic() + 5
    while (current := credentials()).access_key != want:
        assert time.monotonic() < deadline, "the refresh never finished"
        await asyncio.sleep(0.005)
    return current


def test_credentials_near_expiry_refresh_in_a_thread_while_the_held_ones_sign() -> None:
    credentials, role, clock = _refreshable(timedelta(minutes=20))
    assert credentials() == TEMPORARY and role.threads == []  # 20 minutes left: botocore wants nothing yet
    clock[0] = NOW + timedelta(minutes=8)  # 12 minutes left: inside botocore's 15-minute window
    role.gate.clear()

    async def scenario() -> tuple[int, AwsCredentials, AwsCredentials]:
        await asyncio.wait_for(credentials.ready(), 1)  # starts the refresh; does not wait for it
        held = credentials()  # the refresh is blocked at the endpoint: the hook must not wait for it
        await asyncio.wait_for(credentials.ready(), 1)  # joins the refresh in flight: no second one
        role.gate.set()
        return threading.get_ident(), held, await _settled(credentials, "ASIAREFRESHED0000001")

    loop_thread, held, refreshed = asyncio.run(scenario())
    assert held == TEMPORARY
    assert refreshed == AwsCredentials("ASIAREFRESHED0000001", "refreshed-secret", "refreshed-token")
    assert len(role.threads) == 1 and role.threads[0] != loop_thread


def test_expired_credentials_wait_for_their_refresh_without_blocking_the_loop() -> None:
    credentials, role, clock = _refreshable(timedelta(minutes=20))
    clock[0] = NOW + timedelta(minutes=21)  # expired: the process was frozen past the expiry
    signer = RequestSigner(credentials, "us-east-1", clock=lambda: clock[0])

    async def scenario() -> tuple[int, dict[str, str]]:
        await signer.ready()
        return threading.get_ident(), signer("POST", URL, JSON, BODY)

    loop_thread, headers = asyncio.run(scenario())
    assert "Credential=ASIAREFRESHED0000001/" in headers["authorization"]
    assert len(role.threads) == 1 and role.threads[0] != loop_thread


def test_a_failed_refresh_fails_expired_requests_at_once_and_is_retried_later() -> None:
    credentials, role, clock = _refreshable(timedelta(minutes=20))
    clock[0] = NOW + timedelta(minutes=21)
    role.fail = True
    signer = RequestSigner(credentials, "us-east-1", clock=lambda: clock[0])

    async def request() -> dict[str, str]:
        await signer.ready()
        return signer("POST", URL, JSON, BODY)

    for _ in range(3):  # one refresh attempt; the next requests fail without calling the endpoint
        with pytest.raises(UpstreamError) as info:
            asyncio.run(request())
        assert info.value.category is UpstreamCategory.AUTHENTICATION
    assert len(role.threads) == 1
    clock[0] += timedelta(seconds=11)  # past the retry interval: the next request tries again
    role.fail = False
    assert "Credential=ASIAREFRESHED0000002/" in asyncio.run(request())["authorization"]
    assert len(role.threads) == 2


def test_only_a_signer_whose_credentials_refresh_has_ready() -> None:
    assert getattr(signer(), "ready", None) is None
    credentials, _, _ = _refreshable(timedelta(hours=1))
    assert RequestSigner(credentials, "us-east-1").ready == credentials.ready
    assert TEMPORARY.secret_key not in repr(credentials) and "assume-role" in repr(credentials)


def test_a_role_whose_credentials_cannot_be_fetched_fails_the_publication(
    isolated_aws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    role = _Role([datetime.now(UTC)])  # botocore's own clock here: refreshed keys last an hour from now
    role.fail = True
    expired = RefreshableCredentials(
        TEMPORARY.access_key, TEMPORARY.secret_key, TEMPORARY.token, NOW, role, "assume-role"
    )
    monkeypatch.setattr("botocore.session.Session.get_credentials", lambda self: expired)
    credentials = botocore_credentials("bedrock", path="providers.bedrock")
    assert isinstance(credentials, sigv4._OffLoopCredentials) and role.threads == []  # nothing fetched yet
    signer = RequestSigner(credentials, "us-east-1")
    with pytest.raises(ConfigError) as info:
        _prime_aws(signer, "providers.bedrock")  # what publication does when it builds the transport
    issue = info.value.issues[0]
    assert issue.path == "providers.bedrock" and issue.message == "no AWS credentials: ConnectionError"
    role.fail = False
    _prime_aws(signer, "providers.bedrock")
    assert credentials().access_key.startswith("ASIAREFRESHED") and len(role.threads) == 2


def test_credentials_never_primed_are_fetched_in_a_thread_by_the_first_request() -> None:
    credentials, role, _ = _refreshable(timedelta(0), prime=False)  # expired: the fetch must call the role

    async def first() -> tuple[int, AwsCredentials]:
        await credentials.ready()
        return threading.get_ident(), credentials()

    loop_thread, fetched = asyncio.run(first())
    assert fetched.access_key == "ASIAREFRESHED0000001" and len(role.threads) == 1 and role.threads[0] != loop_thread


def test_botocore_is_asked_about_expiry_at_most_once_a_second_while_none_is_near() -> None:
    credentials, _, clock = _refreshable(timedelta(hours=1))
    asked: list[float | None] = []
    found = credentials._found
    wanted = found.refresh_needed
    found.refresh_needed = lambda refresh_in=None: asked.append(refresh_in) or wanted(refresh_in)
    signer = RequestSigner(credentials, "us-east-1", clock=lambda: clock[0])

    async def requests(count: int) -> None:
        for _ in range(count):
            await signer.ready()
            signer("POST", URL, JSON, BODY)

    asyncio.run(requests(50))
    assert asked == [None]  # the first ready(): an hour left, so the next second needs no question
    clock[0] += timedelta(seconds=2)
    asyncio.run(requests(50))
    assert asked == [None, None]
