"""Lambda's SQS record and EventBridge event shapes, built from what boto3 returns (no server)."""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime, timedelta, timezone

from tollway.cloud.runner import scheduled_event, sqs_record

ARN = "arn:aws:sqs:eu-west-1:000000000000:work"


def test_list_and_binary_attributes_take_lambdas_camel_case_and_base64() -> None:
    message = {
        "MessageId": "m-1",
        "ReceiptHandle": "rh-1",
        "Body": "{}",
        "MD5OfBody": "99914b932bd37a50b983c5e7c90ae93b",
        "MD5OfMessageAttributes": "abc",
        "Attributes": {"ApproximateReceiveCount": "3", "AWSTraceHeader": "Root=1-x"},
        "MessageAttributes": {
            "tags": {"DataType": "String", "StringListValues": ["a", "b"]},
            "blobs": {"DataType": "Binary.raw", "BinaryValue": b"\xff\x00", "BinaryListValues": [b"\x01", b"\x02"]},
        },
    }

    record = sqs_record(message, queue_arn=ARN, region="eu-west-1")

    assert record["messageAttributes"] == {
        "tags": {"stringListValues": ["a", "b"], "binaryListValues": [], "dataType": "String"},
        "blobs": {
            "binaryValue": base64.b64encode(b"\xff\x00").decode(),
            "stringListValues": [],
            "binaryListValues": ["AQ==", "Ag=="],
            "dataType": "Binary.raw",
        },
    }
    assert record["attributes"] == {"ApproximateReceiveCount": "3", "AWSTraceHeader": "Root=1-x"}
    assert record["md5OfMessageAttributes"] == "abc"
    assert (record["eventSource"], record["eventSourceARN"], record["awsRegion"]) == ("aws:sqs", ARN, "eu-west-1")


def test_a_message_without_attributes_has_empty_maps_and_no_attribute_digest() -> None:
    record = sqs_record({"MessageId": "m", "ReceiptHandle": "r", "Body": "hello"}, queue_arn=ARN, region="eu-west-1")

    assert record["attributes"] == {} and record["messageAttributes"] == {}
    assert "md5OfMessageAttributes" not in record
    assert record["md5OfBody"] == hashlib.md5(b"hello").hexdigest()
    assert list(record) == [
        "messageId",
        "receiptHandle",
        "body",
        "attributes",
        "messageAttributes",
        "md5OfBody",
        "eventSource",
        "eventSourceARN",
        "awsRegion",
    ]


def test_scheduled_event_time_is_utc_to_the_second() -> None:
    local = datetime(2030, 1, 1, 9, 30, 15, 123456, tzinfo=timezone(timedelta(hours=2)))

    event = scheduled_event(at=local, rule_arn="arn:aws:events:eu-west-1:1:rule/r", account="1", region="eu-west-1")

    assert event["time"] == "2030-01-01T07:30:15Z"
    assert datetime.strptime(event["time"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) == local.replace(microsecond=0)
    assert event["resources"] == ["arn:aws:events:eu-west-1:1:rule/r"]
    assert scheduled_event(at=local, rule_arn="a", account="1", region="r")["id"] != event["id"]
