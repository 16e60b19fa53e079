from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from unittest import mock
from urllib.parse import quote, urlsplit

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tollway.exceptions import ConfigError
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
