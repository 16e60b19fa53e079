from __future__ import annotations

import orjson
import pytest

from tollway.export import ExportRequest, InvalidExportRequest, decode_message, encode_message

BASE = {"purpose": "evaluation", "sinceMs": 1000, "untilMs": 2000, "requestedBy": "alice", "approvedBy": "dpo"}


def test_the_export_id_derives_from_the_request_so_an_equivalent_request_gets_the_same_one() -> None:
    a = ExportRequest.parse(BASE | {"filters": {"tenants": ["b", "a", "a"]}})
    b = ExportRequest.parse(BASE | {"filters": {"tenants": ["a", "b"]}})
    other = ExportRequest.parse(BASE | {"purpose": "training"})
    assert a.export_id == b.export_id == f"exp-{a.digest()[:24]}"
    assert a.filters.tenants == ("a", "b")
    assert other.export_id != a.export_id


def test_an_explicit_export_id_is_kept_and_is_not_part_of_the_digest() -> None:
    named = ExportRequest.parse(BASE | {"exportId": "q3-eval.v1"})
    assert named.export_id == "q3-eval.v1"
    assert named.digest() == ExportRequest.parse(BASE).digest()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"untilMs": 1000}, "(request)"),
        ({"purpose": "marketing"}, "purpose"),
        ({"exportId": "../etc"}, "exportId"),
        ({"approvedBy": ""}, "approvedBy"),
        ({"shardRecords": 0}, "shardRecords"),
        ({"transformations": {"pii": "reveal"}}, "transformations.pii"),
        ({"filters": {"tenants": "acme"}}, "filters.tenants"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_an_invalid_request_is_refused_naming_the_field_not_the_value(change: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidExportRequest) as caught:
        ExportRequest.parse(BASE | change)
    assert field in str(caught.value)
    assert "marketing" not in str(caught.value) and "reveal" not in str(caught.value)


def test_a_missing_approver_is_refused() -> None:
    with pytest.raises(InvalidExportRequest, match="approvedBy"):
        ExportRequest.parse({k: v for k, v in BASE.items() if k != "approvedBy"})


def test_the_queue_message_round_trips_with_its_export_id() -> None:
    request = ExportRequest.parse(BASE | {"transformations": {"toolCalls": "drop", "pii": "redact"}})
    body = encode_message(request)
    assert orjson.loads(body)["v"] == 1
    assert orjson.loads(body)["export"]["exportId"] == request.export_id
    assert decode_message(body) == request


@pytest.mark.parametrize("body", ["not json", '{"v": 2, "export": {}}', '{"v": 1}', "[]", "x" * 70_000])
def test_a_malformed_message_is_an_invalid_request(body: str) -> None:
    with pytest.raises(InvalidExportRequest):
        decode_message(body)
