"""Structured output from the mock: JSON that satisfies the request's schema, the same every time."""

from __future__ import annotations

import datetime
import enum
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import httpx
import jsonschema  # type: ignore[import-untyped]
import openai
import orjson
import pytest
import pytest_asyncio
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel, Field, HttpUrl

from tollway.mock import MockServer
from tollway.mock.content import tool_arguments
from tollway.mock.json_instance import instance

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
FORMATS = jsonschema.FormatChecker(["date-time", "date", "email", "uuid", "ipv4", "ipv6"])


class Colour(enum.Enum):
    RED = "red"
    GREEN = "green"


class Address(BaseModel):
    street: str
    postcode: Annotated[str, Field(pattern=r"^\d{5}(-\d{4})?$")]


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: Annotated[int, Field(ge=1, le=9)]


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class Node(BaseModel):
    name: str
    children: list[Node] = []
    parent: Node | None = None


class Order(BaseModel):
    """Every shape pydantic emits that a structured-output model commonly uses."""

    id: uuid.UUID
    customer: Annotated[str, Field(min_length=12, max_length=14)]
    quantity: Annotated[int, Field(gt=17, lt=130, multiple_of=5)]
    discount: Annotated[float, Field(ge=0, le=1)]
    price: Annotated[float, Field(gt=2, multiple_of=0.25)]
    colour: Colour
    status: Literal["open", "shipped"]
    tags: list[str]
    lines: Annotated[list[Address], Field(min_length=2)]
    billing: Address | None
    pet: Cat | Dog = Field(discriminator="kind")
    placed: datetime.datetime
    due: datetime.date
    site: HttpUrl
    pair: tuple[int, str]
    counts: dict[str, int]
    codes: Annotated[set[int], Field(min_length=3)]
    tree: Node
    note: str | None = None


def test_instances_of_pydantic_schemas_validate_as_the_model() -> None:
    for schema in (Order.model_json_schema(), to_strict_json_schema(Order)):
        value = instance(schema)

        jsonschema.validate(value, schema, format_checker=FORMATS)
        order = Order.model_validate(value)
        assert order.billing is not None and order.note == "mock-note"
        assert len(order.lines) == 2 and len(order.codes) == 3
        assert order.tree.children and order.tree.children[0].children == []


def test_instances_are_deterministic() -> None:
    schema = to_strict_json_schema(Order)

    assert orjson.dumps(instance(schema)) == orjson.dumps(instance(schema))
    assert instance({"type": "object", "properties": {"city": {"type": "string"}}}) == {"city": "mock-city"}


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 2},
        {"type": "integer", "minimum": 10, "multipleOf": 7},
        {"type": "number", "exclusiveMaximum": 0},
        {"type": "number", "minimum": 0.1, "maximum": 0.2},
        {"type": "string", "maxLength": 2},
        {"type": "string", "minLength": 20},
        {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"},
        {"type": "string", "format": "date-time"},
        {"type": ["null", "boolean"]},
        {"const": {"fixed": [1, 2]}},
        {"enum": [3, "x"]},
        {"type": "array", "items": {"type": "integer"}, "minItems": 3, "uniqueItems": True},
        {"type": "array", "items": {"type": "string"}, "maxItems": 0},
        {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}], "items": False},
        {"allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"required": ["b"]}]},
        {"oneOf": [{"type": "null"}, {"type": "object", "required": ["k"], "properties": {"k": {"const": 1}}}]},
        {"$defs": {"a~b": {"type": "string"}}, "properties": {"x": {"$ref": "#/$defs/a~0b"}}, "required": ["x"]},
        {"definitions": {"T": {"type": "array", "items": {"$ref": "#/definitions/T"}}}, "$ref": "#/definitions/T"},
        {},
    ],
)
def test_instances_validate_against_the_schema(schema: dict[str, Any]) -> None:
    jsonschema.validate(instance(schema), schema, format_checker=FORMATS)


def test_a_schema_with_no_finite_instance_still_ends() -> None:
    schema = {"$defs": {"N": {"type": "object", "required": ["n"], "properties": {"n": {"$ref": "#/$defs/N"}}}}}

    value = instance({**schema, "$ref": "#/$defs/N"})

    depth = 0
    while isinstance(value, dict) and value:
        value, depth = value["n"], depth + 1
    assert 0 < depth <= 64


def test_tool_arguments_are_an_instance_of_the_tool_schema() -> None:
    schema = to_strict_json_schema(Order)

    arguments = orjson.loads(tool_arguments(schema))

    assert Order.model_validate(arguments) == Order.model_validate(instance(schema))
    assert tool_arguments({"type": "string"}) == "{}"


# ---------------------------------------------------------------- over HTTP


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mock() -> AsyncIterator[MockServer]:
    async with MockServer() as server:
        yield server


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(mock: MockServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=mock.base_url, timeout=5) as http:
        yield http


def json_schema_format(model: type[BaseModel]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": model.__name__, "schema": to_strict_json_schema(model)}}


def openai_body(**extra: Any) -> dict[str, Any]:
    return {"model": "mock-gpt", "messages": [{"role": "user", "content": "an order please"}], **extra}


def stream_text(body: str) -> str:
    frames = [block.removeprefix("data: ") for block in body.split("\n\n") if block]
    assert frames[-1] == "[DONE]"
    return "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in map(orjson.loads, frames[:-1])
        if c["choices"] and c["choices"][0]["finish_reason"] is None
    )


@pytest.mark.asyncio(loop_scope="module")
async def test_openai_json_schema_reply_is_the_same_instance_buffered_and_streamed(client: httpx.AsyncClient) -> None:
    body = openai_body(response_format=json_schema_format(Order), max_tokens=3)

    buffered = (await client.post(CHAT, json=body)).json()
    streamed = (await client.post(CHAT, json={**body, "stream": True, "stream_options": {"include_usage": True}})).text

    [choice] = buffered["choices"]
    assert choice["finish_reason"] == "stop"
    content = choice["message"]["content"]
    assert orjson.loads(content) == instance(to_strict_json_schema(Order))
    Order.model_validate_json(content)
    assert stream_text(streamed) == content
    assert buffered["usage"]["completion_tokens"] == -(-len(content) // 4)


@pytest.mark.asyncio(loop_scope="module")
async def test_openai_json_object_reply_is_an_object_carrying_the_text_reply(client: httpx.AsyncClient) -> None:
    response = await client.post(CHAT, json=openai_body(response_format={"type": "json_object"}))

    assert orjson.loads(response.json()["choices"][0]["message"]["content"]) == {
        "reply": "Mock reply #3: an order please"
    }
    text = await client.post(CHAT, json=openai_body(response_format={"type": "text"}))
    assert text.json()["choices"][0]["message"]["content"] == "Mock reply #3: an order please"


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    "response_format",
    [
        "json",
        {"type": "yaml"},
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": {"schema": {}}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": []}},
    ],
)
async def test_openai_invalid_response_format_is_a_400(client: httpx.AsyncClient, response_format: Any) -> None:
    response = await client.post(CHAT, json=openai_body(response_format=response_format))

    assert response.status_code == 400
    assert response.json()["error"]["param"] == "response_format"


@pytest.mark.asyncio(loop_scope="module")
async def test_anthropic_forced_tool_input_satisfies_the_tool_schema(client: httpx.AsyncClient) -> None:
    tool = {"name": "record_order", "input_schema": Order.model_json_schema()}
    body = {
        "model": "mock-claude",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "an order please"}],
        "tools": [tool],
        "tool_choice": {"type": "tool", "name": "record_order"},
    }

    message = (await client.post(MESSAGES, json=body)).json()
    streamed = (await client.post(MESSAGES, json={**body, "stream": True})).text

    Order.model_validate(message["content"][0]["input"])
    fragments = [
        orjson.loads(line.removeprefix("data: "))["delta"]["partial_json"]
        for line in streamed.splitlines()
        if line.startswith("data: ") and '"input_json_delta"' in line
    ]
    assert orjson.loads("".join(fragments)) == message["content"][0]["input"]


@pytest.mark.asyncio(loop_scope="module")
async def test_official_sdk_parse_gets_a_model_instance_buffered_and_streamed(mock: MockServer) -> None:
    messages: list[Any] = [{"role": "user", "content": "an order please"}]
    async with openai.AsyncOpenAI(base_url=mock.base_url + "/v1", api_key="k", max_retries=0) as sdk:
        parsed = await sdk.chat.completions.parse(model="m", messages=messages, response_format=Order)
        async with sdk.chat.completions.stream(model="m", messages=messages, response_format=Order) as stream:
            final = await stream.get_final_completion()

    assert isinstance(parsed.choices[0].message.parsed, Order)
    assert final.choices[0].message.parsed == parsed.choices[0].message.parsed
