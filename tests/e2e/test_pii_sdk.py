"""Reversible PII with the official SDKs: the provider never sees the canaries, the caller gets them
back exactly, buffered and streamed, and neither the gateway's log nor its metrics hold them.

``pii-openai-v1`` is served by the OpenAI-format mock, ``pii-claude-v1`` by the Anthropic-format
one; the mock echoes what it was sent, so every placeholder comes back in the answer, split across
stream deltas wherever the mock cuts them, and its request log shows what it saw.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from tests.e2e.conftest import mock_requests
from tests.support.processes import Gateway, Proc

pytestmark = pytest.mark.e2e

EMAIL = "canary.person@example.org"
CARD = "4111 1111 1111 1111"
IBAN = "GB82 WEST 1234 5698 7654 32"
PROMPT = f"Contact {EMAIL} about card {CARD} and IBAN {IBAN}; again: {EMAIL}."
# Whole values, spaced or compact: a short prefix such as "4111" also occurs by chance in hex ids.
CANARIES = (EMAIL, CARD, CARD.replace(" ", ""), IBAN, IBAN.replace(" ", ""))


@pytest.fixture
def oai(gateway: Gateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url, api_key=gateway.keys["team-a"], max_retries=0, timeout=20) as c:
        yield c


@pytest.fixture
def claude(gateway: Gateway) -> Iterator[anthropic.Anthropic]:
    base = gateway.base_url.removesuffix("/v1")
    with anthropic.Anthropic(base_url=base, api_key=gateway.keys["team-a"], max_retries=0, timeout=20) as c:
        yield c


def _provider_saw_placeholders_only(mock: Proc, before: set[object]) -> None:
    new = [r for r in mock_requests(mock) if r["seq"] not in before]
    assert new, "the mock saw no request"
    for record in new:
        echo = str(record.get("echo", ""))
        assert not any(c in echo for c in CANARIES), echo
        assert "[TWPII1_EMAIL_" in echo and "[TWPII1_CARD_" in echo and "[TWPII1_IBAN_" in echo, echo


def _seen(mock: Proc) -> set[object]:
    return {r["seq"] for r in mock_requests(mock)}


@pytest.mark.parametrize("alias", ["pii-openai-v1", "pii-claude-v1"])
def test_chat_completions_buffered_and_streamed(oai: openai.OpenAI, mock_provider: Proc, alias: str) -> None:
    before = _seen(mock_provider)
    answer = oai.chat.completions.create(model=alias, messages=[{"role": "user", "content": PROMPT}])
    assert PROMPT in (answer.choices[0].message.content or "")
    with oai.chat.completions.create(model=alias, messages=[{"role": "user", "content": PROMPT}], stream=True) as s:
        text = "".join(c.choices[0].delta.content or "" for c in s if c.choices)
    assert PROMPT in text and "TWPII" not in text
    _provider_saw_placeholders_only(mock_provider, before)


def test_anthropic_messages_streamed_with_the_sdk_helpers(claude: anthropic.Anthropic, mock_provider: Proc) -> None:
    before = _seen(mock_provider)
    with claude.messages.stream(
        model="pii-claude-v1", max_tokens=300, messages=[{"role": "user", "content": PROMPT}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert PROMPT in text and "TWPII" not in text
    assert final.content[0].type == "text" and PROMPT in final.content[0].text
    _provider_saw_placeholders_only(mock_provider, before)


def test_responses_streamed(oai: openai.OpenAI, mock_provider: Proc) -> None:
    before = _seen(mock_provider)
    with oai.responses.create(model="pii-openai-v1", input=PROMPT, stream=True) as stream:
        events = list(stream)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert PROMPT in deltas and "TWPII" not in deltas
    _provider_saw_placeholders_only(mock_provider, before)


def test_no_canary_reaches_the_gateway_log(oai: openai.OpenAI, gateway: Gateway) -> None:
    """The gateway's log (access log on) holds neither a value nor a placeholder; metrics are
    checked in tests/functional/test_pii_pipeline.py, on a gateway that serves them."""
    oai.chat.completions.create(model="pii-openai-v1", messages=[{"role": "user", "content": PROMPT}])
    gateway.proc.wait_log_line(lambda line: "pii-openai-v1" in line)  # the request was logged
    log = gateway.proc.log()
    assert not any(c in log for c in CANARIES) and "TWPII" not in log
