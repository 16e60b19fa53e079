"""Structured output through a real gateway and the real mock: the SDK's ``parse`` gets a model instance.

``chat-fast-v1`` (OpenAI format) declares ``json_object`` and ``json_schema``; ``chat-claude-v1``
(Anthropic format) cannot, so there a schema travels as a forced tool, as LangChain's
``function_calling`` method and ``openai.pydantic_function_tool`` send it.
"""

from __future__ import annotations

import datetime
import enum
import json
from typing import Annotated, Literal

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionNamedToolChoiceParam
from pydantic import BaseModel, Field

from tests.support.processes import Gateway

pytestmark = pytest.mark.e2e

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "book a table"}]


class Seating(enum.Enum):
    INSIDE = "inside"
    TERRACE = "terrace"


class Guest(BaseModel):
    name: str
    age: Annotated[int, Field(ge=18)]
    email: str | None


class Booking(BaseModel):
    restaurant: str
    at: datetime.datetime
    seating: Seating
    status: Literal["pending", "confirmed"]
    party: list[Guest]
    host: Guest
    notes: str | None


def sdk(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=gw.keys["team-a"], max_retries=0, timeout=20)


def test_parse_returns_a_model_instance_buffered_and_streamed(gateway: Gateway) -> None:
    with sdk(gateway) as client:
        buffered = client.chat.completions.parse(model="chat-fast-v1", messages=MESSAGES, response_format=Booking)
        with client.chat.completions.stream(
            model="chat-fast-v1", messages=MESSAGES, response_format=Booking, stream_options={"include_usage": True}
        ) as stream:
            streamed = stream.get_final_completion()

    booking = buffered.choices[0].message.parsed
    assert isinstance(booking, Booking)
    assert booking.party and booking.host.age >= 18
    assert streamed.choices[0].message.parsed == booking
    assert buffered.model == "chat-fast-v1"


def test_json_object_reply_is_a_json_object(gateway: Gateway) -> None:
    with sdk(gateway) as client:
        resp = client.chat.completions.create(
            model="chat-fast-v1", messages=MESSAGES, response_format={"type": "json_object"}
        )

    assert json.loads(resp.choices[0].message.content or "") == {"reply": "Mock reply #3: book a table"}


def test_a_forced_tool_carries_the_schema_on_the_anthropic_route(gateway: Gateway) -> None:
    tool = openai.pydantic_function_tool(Booking)
    choice: ChatCompletionNamedToolChoiceParam = {"type": "function", "function": {"name": "Booking"}}
    with sdk(gateway) as client:
        buffered = client.chat.completions.parse(
            model="chat-claude-v1", messages=MESSAGES, tools=[tool], tool_choice=choice
        )
        with client.chat.completions.stream(
            model="chat-claude-v1", messages=MESSAGES, tools=[tool], tool_choice=choice
        ) as stream:
            streamed = stream.get_final_completion()

    [call] = buffered.choices[0].message.tool_calls or []
    assert isinstance(call.function.parsed_arguments, Booking)
    [streamed_call] = streamed.choices[0].message.tool_calls or []
    assert streamed_call.function.parsed_arguments == call.function.parsed_arguments


def test_response_format_on_an_alias_without_the_capability_is_refused(gateway: Gateway) -> None:
    with sdk(gateway) as client, pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.parse(model="chat-claude-v1", messages=MESSAGES, response_format=Booking)

    assert "response_format" in str(refused.value)
