"""The runner's judgements, against scripted OpenAI-format answers (no socket): each check's reason,
and the configuration it publishes to reach one deployment."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from tests.fakes.transport import MockRequest, MockResponse, MockTransport
from tollway.config.root import Publisher
from tollway.config.schema import RouterConfig
from tollway.conformance import NotServed, conformance_config, run_deployment
from tollway.conformance.result import ConformanceResult

USAGE = {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}


def config() -> RouterConfig:
    def provider(name: str) -> dict[str, Any]:
        return {"type": "openai", "baseUrl": f"https://{name}.example.com/v1", "authMode": "none"}

    def route(rid: str, provider: str, model: str) -> dict[str, Any]:
        return {"id": rid, "provider": provider, "model": model, "providerFormat": "openai-chat-completions"}

    return RouterConfig.model_validate(
        {
            "providers": {"target": provider("target"), "other": provider("other")},
            "conformance": {"requireConformance": True},
            "principals": [{"id": "p", "tenant": "t", "keys": [{"id": "k", "secretRef": "env:UNSET_FOR_SURE"}]}],
            "models": [
                {"name": "a", "routes": [route("a1", "target", "m1"), route("a2", "other", "m9")]},
                {"name": "b", "routes": [route("b1", "target", "m1"), route("b2", "target", "m2")]},
                {"name": "e", "operations": ["embeddings"], "routes": [route("e1", "target", "embed")]},
            ],
        }
    )


def test_the_published_configuration_holds_the_deployment_and_one_route_per_chat_model() -> None:
    cut = conformance_config(config(), "target")
    assert list(cut.providers) == ["target"]
    assert cut.principals == []
    (alias,) = cut.models
    assert [(r.provider, r.model) for r in alias.routes] == [("target", "m1"), ("target", "m2")]
    assert not cut.conformance.requireConformance
    assert all(r.requireConformance is False for r in alias.routes)


def test_a_deployment_or_model_the_configuration_does_not_serve_is_refused_and_the_publisher_closed() -> None:
    closed = []

    class Publishing(Publisher):
        async def aclose(self) -> None:
            closed.append(True)
            await super().aclose()

    with pytest.raises(NotServed, match="not a provider"):
        conformance_config(config(), "absent")
    with pytest.raises(NotServed, match="not 'embed'"):
        asyncio.run(run_deployment(config(), "target", Publishing(), models=["embed"]))
    assert closed == [True]


def _message(content: Any = None, tool_calls: Any = None, finish: str = "stop", usage: Any = USAGE) -> bytes:
    message = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    doc = {"id": "x", "choices": [{"index": 0, "message": message, "finish_reason": finish}]}
    if usage is not None:
        doc["usage"] = usage
    return orjson.dumps(doc)


def _answer(req: MockRequest) -> MockResponse:
    """A deployment with a bad habit per capability; its streams are broken (a non-JSON chunk first)."""
    body = req.json()
    if req.stream:
        return MockResponse(chunks=[b"data: {not json\n\n"])
    if body.get("tool_choice", {}).get("function", {}).get("name") == "conformance_undeclared_tool":
        return MockResponse(status=500, body=b'{"error": {"message": "boom", "type": "server_error"}}')
    if body.get("tools"):
        call = {"id": "c1", "type": "function", "function": {"name": "other_tool", "arguments": "{}"}}
        return MockResponse(body=_message(tool_calls=[call], finish="tool_calls"))
    fmt = (body.get("response_format") or {}).get("type")
    if fmt == "json_schema":
        return MockResponse(body=_message('{"city": "Paris", "population": 2, "mayor": "x"}'))
    if fmt == "json_object":
        return MockResponse(body=_message("[1, 2]"))
    return MockResponse(body=_message("Hello there.", usage=None))


@pytest.fixture
def result() -> ConformanceResult:
    transport = MockTransport(_answer)
    publisher = Publisher(transport_factory=transport.factory())
    (found,) = asyncio.run(run_deployment(config(), "target", publisher, models=["m2"], timeout_s=5))
    assert {r.base_url for r in transport.requests} == {"https://target.example.com/v1"}
    assert {r.json()["model"] for r in transport.requests} == {"m2"}
    return found


def test_each_failed_check_gives_its_reason(result: ConformanceResult) -> None:
    reasons = {c.case: (c.outcome, c.reason) for c in result.cases}
    assert reasons == {
        "chat.buffered": ("pass", ""),
        "usage.buffered": ("fail", "no usage reported"),
        "chat.stream": ("fail", "upstream error: malformed"),
        "usage.stream": ("fail", "upstream error: malformed"),
        "tools.buffered": ("fail", "the tool call names another tool"),
        "tools.stream": ("fail", "upstream error: malformed"),
        "vision.buffered": ("pass", ""),
        "json_object.buffered": ("fail", "the answer is not a JSON object"),
        "json_schema.buffered": ("fail", "the answer has properties the schema does not allow"),
        "errors.invalid_request": ("fail", "classified as server, expected invalid_request"),
    }
    assert (result.model, result.deployment, result.provider_type) == ("m2", "target", "openai")
    assert result.capabilities["chat"] == "pass" and result.capabilities["errors"] == "fail"
