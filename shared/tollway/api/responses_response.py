"""Render canonical results in the OpenAI Responses format: the ``response`` object, the named,
numbered SSE events of a stream, and the ``error`` event. Shapes follow the official ``openai``
SDK's ``Response`` and ``ResponseStreamEvent`` types, which the tests validate against.

Ids: the response is ``resp_`` and the request id's hex; its output items are ``msg_<hex>_<n>``
and ``fc_<hex>_<n>``, ``n`` being the item's output index, so ids are unique and a buffered
answer and a stream name their items alike. A tool call the provider gave no id gets
``call_<hex>_<k>``, ``k`` its ordinal, since Responses clients key calls by ``call_id``.

Status: the canonical finish ``length`` is ``incomplete`` with ``incomplete_details.reason``
``max_output_tokens``, ``content_filter`` is ``incomplete`` with ``content_filter``; every other
finish is ``completed``. In an incomplete response the last output item, the one that was cut
off, is ``incomplete`` too. A refusal is a ``refusal`` part of the message item.

Usage: ``input_tokens`` counts every prompt token, cached or written to the cache, as the
canonical prompt count does; ``input_tokens_details`` splits out ``cached_tokens`` and
``cache_write_tokens``.

Settings: the ``response`` object repeats the request's settings (``tools``, ``tool_choice``,
``parallel_tool_calls``, ``temperature``, ``text``…). A stream's encoder has the canonical request
and repeats them; a buffered answer is rendered from the response alone, so it carries the SDK's
defaults for the fields the type requires (``tools: []``, ``tool_choice: "auto"``,
``parallel_tool_calls: true``) and ``null`` for the others. ``instructions`` is always ``null``:
the canonical request holds them as its leading system message, not apart. ``store`` is not a
field of the response object; nothing is stored.

Streams, in the order OpenAI writes them: ``response.created`` and ``response.in_progress`` with
the first output; per message item ``response.output_item.added``, ``response.content_part.added``,
``response.output_text.delta``…, then ``response.output_text.done``, ``response.content_part.done``
and ``response.output_item.done``; per function call ``response.output_item.added`` (empty
arguments), ``response.function_call_arguments.delta``…, ``.done`` with the whole arguments and
``response.output_item.done``; last ``response.completed`` (or ``response.incomplete``) with the
whole response and its usage. Every event carries ``sequence_number``, from 0, one apart.
An item closes when the next one opens, as OpenAI's do; a text delta after a tool call opens a new
message item. An argument fragment for a call whose item already closed (a provider interleaving
parallel calls; neither of today's codecs does) is still sent under that call's output index,
where the SDK's accumulator adds it, and the final response carries the whole arguments, but the
call's ``.done`` events went out with the arguments it had then.

The encoder holds the text and arguments written so far: the closing events and the final
response repeat them whole, as the format requires.

A stream that fails after its first output ends with one ``error`` event (``code``, ``message``,
``param``, ``sequence_number``), like the other formats' single error frame, and no terminal
``response.*`` event. Not ``response.failed``: its ``error.code`` is a closed set that cannot name
the gateway's codes (``upstream_stream_cut``…), and the pipeline renders its lifetime error frame
when the stream opens, so the frame must not depend on the output written by then. The ``error``
event carries the sequence number the next event would have had; the lifetime frame, rendered
before any event, carries 0.
"""

from __future__ import annotations

from typing import Any

import orjson

from tollway.canonical import (
    CanonicalRequest,
    CanonicalResponse,
    FinishReason,
    StreamEvent,
    StreamFinish,
    TextDelta,
    ToolCallDelta,
    ToolChoice,
    Usage,
)
from tollway.exceptions import GatewayError

__all__ = ["INCOMPLETE_REASONS", "ResponseStream", "render_response", "request_settings", "usage_json"]

INCOMPLETE_REASONS: dict[FinishReason, str] = {"length": "max_output_tokens", "content_filter": "content_filter"}


def _hex(request_id: str) -> str:
    return request_id.removeprefix("req_")


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_prompt_tokens,
            "cache_write_tokens": usage.cache_creation_tokens,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def _tool_choice(choice: ToolChoice | None) -> str | dict[str, str]:
    if choice is None:
        return "auto"
    if choice.mode == "function":
        return {"type": "function", "name": choice.name or ""}
    return choice.mode


def request_settings(req: CanonicalRequest | None) -> dict[str, Any]:
    """The settings the ``response`` object repeats: from ``req``, or, without one, the SDK's
    defaults where the type requires a value and ``null`` elsewhere."""
    if req is None:
        return {
            "instructions": None,
            "max_output_tokens": None,
            "metadata": None,
            "parallel_tool_calls": True,
            "temperature": None,
            "text": None,
            "tool_choice": "auto",
            "tools": [],
            "top_p": None,
            "user": None,
        }
    fmt = req.response_format
    text_format: dict[str, Any] = {"type": "text"}
    if fmt is not None and fmt.type == "json_schema":
        text_format = {"type": "json_schema", **(fmt.json_schema or {})}
    elif fmt is not None:
        text_format = {"type": fmt.type}
    return {
        "instructions": None,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {},
        "parallel_tool_calls": req.parallel_tool_calls if req.parallel_tool_calls is not None else True,
        "temperature": req.temperature,
        "text": {"format": text_format},
        "tool_choice": _tool_choice(req.tool_choice),
        "tools": [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
                "strict": t.strict,
            }
            for t in req.tools or ()
        ],
        "top_p": req.top_p,
        "user": req.user,
    }


def _response(
    resp_id: str,
    created: int,
    model: str,
    settings: dict[str, Any],
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    incomplete: str | None = None,
) -> dict[str, Any]:
    return {
        "id": resp_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "model": model,
        "output": output,
        "previous_response_id": None,
        "reasoning": None,
        "truncation": "disabled",
        **settings,
        "usage": usage,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def _message_item(item_id: str, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def render_response(
    request_id: str, created: int, model: str, resp: CanonicalResponse, req: CanonicalRequest | None = None
) -> bytes:
    hexid = _hex(request_id)
    output: list[dict[str, Any]] = []
    content = [_text_part(resp.content)] if resp.content else []
    if resp.refusal:
        content.append({"type": "refusal", "refusal": resp.refusal})
    if content:
        output.append(_message_item(f"msg_{hexid}_0", "completed", content))
    for call in resp.tool_calls or ():
        output.append(_call_item(f"fc_{hexid}_{len(output)}", call.id, call.name, call.arguments, "completed"))
    incomplete = INCOMPLETE_REASONS.get(resp.finish_reason)
    if incomplete and output:
        output[-1]["status"] = "incomplete"
    usage = usage_json(resp.usage) if resp.usage is not None else None
    status = "incomplete" if incomplete else "completed"
    doc = _response("resp_" + hexid, created, model, request_settings(req), status, output, usage, incomplete)
    return orjson.dumps(doc)


def _event(name: bytes, payload: bytes) -> bytes:
    """One named SSE event. ``payload`` is serialized JSON, which never holds a line break."""
    return b"event: " + name + b"\ndata: " + payload + b"\n\n"


_TEXT_DELTA = b"response.output_text.delta"


class ResponseStream:
    """One stream's events (the module docstring gives their order). ``response.created`` and
    ``response.in_progress`` leave with the first output; the finish is held until :meth:`end`,
    which closes the open item and sends the whole response with the final usage."""

    __slots__ = (
        "_args",
        "_calls",
        "_delta_head",
        "_hex",
        "_items",
        "_open",
        "_reason",
        "_seq",
        "_settings",
        "_started",
        "_text",
        "_top",
    )

    def __init__(self, request_id: str, created: int, model: str, settings: dict[str, Any]) -> None:
        self._hex = _hex(request_id)
        self._top = ("resp_" + self._hex, created, model)
        self._settings = settings
        self._seq = 0
        self._started = False
        self._items: list[dict[str, Any]] = []
        """Each output item as it stands: as added while open, final once closed."""
        self._open = -1
        """The output index of the open item; -1 when none is open."""
        self._text: list[str] = []
        """The open message item's text so far."""
        self._args: dict[int, list[str]] = {}
        """Output index → a function call's argument fragments so far."""
        self._calls: dict[int, int] = {}
        """Canonical tool-call index → output index."""
        self._delta_head = b""
        self._reason: FinishReason = "stop"

    def _frame(self, name: str, fields: dict[str, Any]) -> bytes:
        payload = orjson.dumps({"type": name, **fields, "sequence_number": self._seq})
        self._seq += 1
        return _event(name.encode(), payload)

    def _response(self, status: str, usage: dict[str, Any] | None, incomplete: str | None = None) -> dict[str, Any]:
        resp_id, created, model = self._top
        return _response(resp_id, created, model, self._settings, status, list(self._items), usage, incomplete)

    def _prelude(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        snapshot = {"response": self._response("in_progress", None)}
        return self._frame("response.created", snapshot) + self._frame("response.in_progress", snapshot)

    def _close(self, status: str) -> bytes:
        index = self._open
        if index < 0:
            return b""
        self._open = -1
        item = self._items[index]
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            text = "".join(self._text)
            part = _text_part(text)
            out = self._frame("response.output_text.done", {**where, "content_index": 0, "text": text, "logprobs": []})
            out += self._frame("response.content_part.done", {**where, "content_index": 0, "part": part})
            final = _message_item(item["id"], status, [part])
        else:
            arguments = "".join(self._args[index])
            out = self._frame("response.function_call_arguments.done", {**where, "arguments": arguments})
            final = {**item, "status": status, "arguments": arguments}
        self._items[index] = final
        return out + self._frame("response.output_item.done", {"output_index": index, "item": final})

    def _open_message(self) -> bytes:
        out = self._close("completed")
        index = self._open = len(self._items)
        item_id = f"msg_{self._hex}_{index}"
        item = _message_item(item_id, "in_progress", [])
        self._items.append(item)
        self._text = []
        where = {"item_id": item_id, "output_index": index}
        out += self._frame("response.output_item.added", {"output_index": index, "item": item})
        out += self._frame("response.content_part.added", {**where, "content_index": 0, "part": _text_part("")})
        self._delta_head = (
            (b"event: " + _TEXT_DELTA + b'\ndata: {"type":"' + _TEXT_DELTA + b'","item_id":' + orjson.dumps(item_id))
            + b',"output_index":'
            + str(index).encode()
            + b',"content_index":0,"delta":'
        )
        return out

    def _text_delta(self, text: str) -> bytes:
        out = self._prelude()
        if self._open < 0 or self._items[self._open]["type"] != "message":
            out += self._open_message()
        self._text.append(text)
        seq, self._seq = self._seq, self._seq + 1
        tail = b',"logprobs":[],"sequence_number":' + str(seq).encode() + b"}\n\n"
        return out + self._delta_head + orjson.dumps(text) + tail

    def _tool(self, ev: ToolCallDelta) -> bytes:
        out = self._prelude()
        index = self._calls.get(ev.index)
        if index is None:
            out += self._close("completed")
            index = self._open = self._calls[ev.index] = len(self._items)
            call_id = ev.id or f"call_{self._hex}_{ev.index}"
            item = _call_item(f"fc_{self._hex}_{index}", call_id, ev.name or "", "", "in_progress")
            self._items.append(item)
            self._args[index] = []
            out += self._frame("response.output_item.added", {"output_index": index, "item": item})
        if not ev.arguments:
            return out
        fragments = self._args[index]
        fragments.append(ev.arguments)
        item = self._items[index]
        if index != self._open:
            self._items[index] = {**item, "arguments": "".join(fragments)}
        delta = {"item_id": item["id"], "output_index": index, "delta": ev.arguments}
        return out + self._frame("response.function_call_arguments.delta", delta)

    def event(self, ev: StreamEvent) -> bytes:
        kind = type(ev)
        if kind is TextDelta:
            text = ev.text  # type: ignore[union-attr]
            return self._text_delta(text) if text else b""
        if kind is ToolCallDelta:
            return self._tool(ev)  # type: ignore[arg-type]
        if kind is StreamFinish:
            self._reason = ev.reason  # type: ignore[union-attr]
        return b""

    def end(self, usage: Usage) -> bytes:
        incomplete = INCOMPLETE_REASONS.get(self._reason)
        status = "incomplete" if incomplete else "completed"
        out = self._prelude() + self._close(status)
        name = "response.incomplete" if incomplete else "response.completed"
        return out + self._frame(name, {"response": self._response(status, usage_json(usage), incomplete)})

    def error(self, err: GatewayError) -> bytes:
        """The ``error`` event alone, numbered as the next event would be. Changes no state: the
        pipeline renders its lifetime frame up front."""
        payload = {"type": "error", "code": err.code, "message": err.message, "param": err.param}
        return _event(b"error", orjson.dumps({**payload, "sequence_number": self._seq}))
