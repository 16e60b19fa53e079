"""A ``bedrock`` provider's configuration: region and endpoint defaults, and what it refuses."""

from __future__ import annotations

from typing import Any

import pytest

from tollway.config import parse_config, validate
from tollway.exceptions import ConfigError, ConfigIssue


def config(**provider: Any) -> dict[str, Any]:
    return {
        "providers": {
            "aws": {"type": "bedrock", "providerAccountId": "acct", "quotaGroupId": "acct", **provider},
        },
        "models": [
            {
                "name": "claude",
                "capabilities": ["streaming", "tools", "vision"],
                "routes": [
                    {
                        "id": "r",
                        "provider": "aws",
                        "model": "anthropic.claude-3-5-sonnet-20240620-v1:0",
                        "providerFormat": "bedrock-converse",
                    }
                ],
            }
        ],
    }


def issues(data: dict[str, Any]) -> list[tuple[str, str]]:
    return [(i.path, i.message) for i in validate(parse_config(data)) if isinstance(i, ConfigIssue)]


@pytest.fixture(autouse=True)
def no_region(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)


def test_the_endpoint_defaults_to_the_regions_bedrock_runtime() -> None:
    provider = parse_config(config(awsRegion="eu-central-1")).providers["aws"]
    assert provider.baseUrl == "https://bedrock-runtime.eu-central-1.amazonaws.com"
    assert issues(config(awsRegion="eu-central-1")) == []


def test_the_region_defaults_to_aws_region_then_aws_default_region(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    assert parse_config(config()).providers["aws"].awsRegion == "us-west-2"
    monkeypatch.setenv("AWS_REGION", "ap-southeast-2")
    provider = parse_config(config()).providers["aws"]
    assert (provider.awsRegion, provider.baseUrl) == (
        "ap-southeast-2",
        "https://bedrock-runtime.ap-southeast-2.amazonaws.com",
    )


def test_an_explicit_base_url_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "https://bedrock-runtime-fips.us-east-1.amazonaws.com"
    provider = parse_config(config(awsRegion="us-east-1", baseUrl=url)).providers["aws"]
    assert provider.baseUrl == url


def test_no_region_anywhere_is_reported_at_aws_region() -> None:
    assert issues(config()) == [
        ("providers.aws.awsRegion", "required: set awsRegion, or AWS_REGION or AWS_DEFAULT_REGION")
    ]


def test_a_region_that_is_not_a_region_name_is_refused() -> None:
    assert [p for p, _ in issues(config(awsRegion="us-east-1.evil.example"))] == ["providers.aws.awsRegion"]


def test_bedrock_takes_no_api_key_credentials() -> None:
    data = config(awsRegion="us-east-1", credentials=[{"id": "k", "secretRef": "env:TOLLWAY_KEY"}])
    assert [p for p, _ in issues(data)] == ["providers.aws.credentials"]


def test_aws_settings_belong_to_bedrock_only() -> None:
    data = config(awsRegion="us-east-1")
    data["providers"]["oa"] = {
        "type": "openai",
        "baseUrl": "https://api.openai.com/v1",
        "providerAccountId": "o",
        "quotaGroupId": "o",
        "credentials": [{"id": "k", "secretRef": "env:TOLLWAY_KEY"}],
        "awsRegion": "us-east-1",
    }
    assert [p for p, _ in issues(data)] == ["providers.oa.awsRegion"]


def test_bedrock_converse_needs_a_bedrock_provider() -> None:
    data = config(awsRegion="us-east-1")
    data["providers"]["oa"] = {
        "type": "openai",
        "baseUrl": "https://api.openai.com/v1",
        "providerAccountId": "o",
        "quotaGroupId": "o",
        "credentials": [{"id": "k", "secretRef": "env:TOLLWAY_KEY"}],
    }
    data["models"][0]["routes"][0]["provider"] = "oa"
    assert [p for p, _ in issues(data)] == ["models[0].routes[0].providerFormat"]


def test_other_provider_types_still_require_a_base_url() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"providers": {"o": {"type": "openai"}}})
    assert [(i.path, i.message) for i in info.value.issues] == [("providers.o.baseUrl", "field required")]
