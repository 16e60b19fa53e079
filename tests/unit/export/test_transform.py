from __future__ import annotations

import dataclasses
import hashlib

import orjson

from tests.unit.export.corpus import BASE_MS, EMAIL, chat_record
from tollway.export import Transformations
from tollway.export.transform import dumps, redact, row

KEEP = Transformations()
REDACT_DROP = Transformations(tool_calls="drop", pii="redact")


def test_keep_tokenized_keeps_placeholders_and_tool_calls() -> None:
    out = row(chat_record("r1", BASE_MS), "d" * 64, KEEP)
    text = dumps(out).decode()
    assert EMAIL in text
    assert [m["role"] for m in out["messages"]] == ["system", "user", "assistant", "tool"]
    assert out["tools"] == [{"name": "weather", "parameters": {"type": "object"}}]
    assert out["answer"]["tool_calls"][0]["name"] == "send"
    assert (out["requestId"], out["contentDigest"], out["mode"]) == ("r1", "d" * 64, "tokenized-content")


def test_redact_replaces_every_placeholder_with_its_kind_tool_arguments_included() -> None:
    out = row(chat_record("r1", BASE_MS), "d" * 64, Transformations(pii="redact"))
    text = dumps(out).decode()
    assert "TWPII1" not in text
    assert out["messages"][1]["content"] == "Mail [REDACTED_EMAIL] the weather in Paris."
    assert out["answer"]["tool_calls"][0]["arguments"] == '{"to": "[REDACTED_EMAIL]"}'


def test_redact_leaves_keys_and_non_strings_alone() -> None:
    assert redact({EMAIL: [1, None, True, EMAIL]}) == {EMAIL: [1, None, True, "[REDACTED_EMAIL]"]}


def test_drop_tool_calls_removes_tools_tool_messages_and_calls() -> None:
    out = row(chat_record("r1", BASE_MS), "d" * 64, REDACT_DROP)
    assert [m["role"] for m in out["messages"]] == ["system", "user"]
    assert "tools" not in out
    assert "tool_calls" not in out["answer"]
    assert out["answer"] == {
        "role": "assistant",
        "content": "Sent to [REDACTED_EMAIL]: sunny.",
        "finish_reason": "stop",
    }


def test_a_row_carries_the_digest_of_itself_without_the_digest() -> None:
    out = row(chat_record("r1", BASE_MS), "d" * 64, KEEP)
    body = {k: v for k, v in out.items() if k != "digest"}
    assert out["digest"] == hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert row(chat_record("r1", BASE_MS), "d" * 64, KEEP) == out


def test_a_request_that_failed_before_an_answer_has_a_null_answer() -> None:
    record = chat_record("r1", BASE_MS)
    failed = dataclasses.replace(record, response=None)
    assert row(failed, "d" * 64, KEEP)["answer"] is None
