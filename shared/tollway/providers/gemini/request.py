"""Encoding a canonical request as a Gemini ``GenerateContentRequest``.

The canonical request is shaped after OpenAI's; Gemini's differs in four ways that matter here:

- System and developer messages become ``systemInstruction``, one text part joined by blank lines
  (images in them are left out, as from Anthropic's string ``system``).
- Turns are ``user`` or ``model`` and consecutive turns of one role merge into one, so that the
  ``functionResponse`` parts answering parallel calls travel together, as Gemini asks.
- Gemini's ``functionCall`` and ``functionResponse`` carry no id: a tool result names the function
  it answers. The name is found by the ``tool_call_id``, among the calls of the assistant turns
  before it (a later call with the same id wins, since the decoder's synthesized ids repeat across
  turns). A call's ``thoughtSignature`` comes back from its id, on its ``functionCall`` part, as
  Gemini 3 requires (:mod:`.signatures`).
- Schemas are sent as ``parametersJsonSchema`` and ``responseJsonSchema``: clients write JSON
  Schema, and the OpenAPI subset of ``parameters`` and ``responseSchema`` refuses what they commonly
  use (``additionalProperties``, ``$ref``, ``const``).

Refused, never dropped: images by remote URL (Gemini reads inline data or its own Files API URIs,
and the codec cannot fetch), images in a tool result (a ``functionResponse`` holds JSON), thinking
blocks and a thinking budget (Anthropic's signed thinking has no Gemini equivalent). Not forwarded,
as hints or fields of other formats: cache breakpoints, ``anthropic-beta``, ``user``, ``metadata``,
``parallel_tool_calls`` (Gemini cannot forbid parallel calls) and OpenAI ``extensions``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tollway.canonical import (
    CanonicalRequest,
    ContentPart,
    ImagePart,
    Message,
    ResponseFormat,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolDefinition,
)
from tollway.exceptions import InvalidRequest, UnsupportedParameter
from tollway.providers.gemini.signatures import split_id
from tollway.providers.openai_chat import nonblank_parts, tool_arguments

__all__ = ["encode_body"]

_MODE = {"auto": "AUTO", "required": "ANY", "function": "ANY", "none": "NONE"}


def encode_body(req: CanonicalRequest) -> dict[str, Any]:
    """The request body; the model and the method are in the path, not here."""
    if req.thinking_budget is not None:
        raise UnsupportedParameter("'thinking' is not supported by this model.", param="thinking")
    system, contents = _conversation(req.messages)
    body: dict[str, Any] = {"contents": contents}
    if system:
        body["systemInstruction"] = {"parts": [{"text": system}]}
    if req.tools:
        body["tools"] = [{"functionDeclarations": [_declaration(t) for t in req.tools]}]
        if req.tool_choice is not None:
            body["toolConfig"] = {"functionCallingConfig": _calling_config(req.tool_choice)}
    config = _generation_config(req)
    if config:
        body["generationConfig"] = config
    return body


def _generation_config(req: CanonicalRequest) -> dict[str, Any]:
    optional: dict[str, Any] = {
        "maxOutputTokens": req.max_output_tokens,
        "temperature": req.temperature,
        "topP": req.top_p,
        "topK": req.top_k,
        "stopSequences": req.stop,
    }
    config = {k: v for k, v in optional.items() if v is not None}
    if req.response_format is not None:
        config.update(_response_format(req.response_format))
    return config


def _response_format(fmt: ResponseFormat) -> dict[str, Any]:
    if fmt.type == "text":
        return {}
    if fmt.type == "json_object":
        return {"responseMimeType": "application/json"}
    schema = fmt.json_schema.get("schema") if fmt.json_schema is not None else None
    if not isinstance(schema, dict):
        raise InvalidRequest("response_format of type json_schema needs a json_schema.", param="response_format")
    return {"responseMimeType": "application/json", "responseJsonSchema": schema}


def _conversation(messages: list[Message]) -> tuple[str, list[dict[str, Any]]]:
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    """Tool call id → function name, from the assistant turns so far."""
    for m in messages:
        if m.role in ("system", "developer"):
            text = m.text()
            if text:
                system.append(text)
            continue
        if m.role == "tool":
            role, parts = "user", [_function_response(m, names)]
        elif m.role == "assistant":
            role, parts = "model", nonblank_parts(m.content, _part)
            for call in m.tool_calls or ():
                names[call.id] = call.name
                parts.append(_function_call(call))
        else:
            role, parts = "user", nonblank_parts(m.content, _part)
        if not parts:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["parts"].extend(parts)
        else:
            turns.append({"role": role, "parts": parts})
    return "\n\n".join(system), turns


def _function_call(call: ToolCall) -> dict[str, Any]:
    """The call's part, with the thought signature its id carries (:mod:`.signatures`)."""
    part: dict[str, Any] = {"functionCall": {"name": call.name, "args": tool_arguments(call)}}
    signature = split_id(call.id)[1]
    if signature is not None:
        part["thoughtSignature"] = signature
    return part


def _part(part: ContentPart) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"text": part.text}
    if isinstance(part, ImagePart):
        return {"inlineData": _inline_data(part.url)}
    raise UnsupportedParameter("Thinking blocks are not supported by this model.", param="messages")


def _inline_data(url: str) -> dict[str, str]:
    if url.startswith("data:"):
        header, comma, data = url[len("data:") :].partition(",")
        media_type, *params = header.split(";")
        if not comma or "base64" not in params or not media_type:
            raise InvalidRequest("An image data URL must be data:<media-type>;base64,<data>.", param="messages")
        return {"mimeType": media_type, "data": data}
    if url.startswith(("https://", "http://")):
        raise UnsupportedParameter(
            "Images by URL are not supported by this model; send the image as a base64 data URL.", param="messages"
        )
    raise InvalidRequest("An image URL must be an http(s) URL or a base64 data URL.", param="messages")


def _function_response(m: Message, names: Mapping[str, str]) -> dict[str, Any]:
    if not m.tool_call_id:
        raise InvalidRequest("A tool message needs a tool_call_id.", param="messages")
    name = names.get(m.tool_call_id)
    if name is None:
        raise InvalidRequest(
            f"Tool message {m.tool_call_id!r} answers no tool call of an earlier assistant message.", param="messages"
        )
    if isinstance(m.content, list) and any(type(p) is not TextPart for p in m.content):
        raise UnsupportedParameter("Images in tool results are not supported by this model.", param="messages")
    return {"functionResponse": {"name": name, "response": {"content": m.text()}}}


def _declaration(tool: ToolDefinition) -> dict[str, Any]:
    out: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        out["description"] = tool.description
    if tool.parameters is not None:
        out["parametersJsonSchema"] = tool.parameters
    return out


def _calling_config(choice: ToolChoice) -> dict[str, Any]:
    out: dict[str, Any] = {"mode": _MODE[choice.mode]}
    if choice.mode == "function":
        if not choice.name:
            raise InvalidRequest("tool_choice of type function needs a function name.", param="tool_choice")
        out["allowedFunctionNames"] = [choice.name]
    return out
