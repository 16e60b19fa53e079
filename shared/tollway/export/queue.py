"""The export queue: where ``tollway export create`` puts a request for the export function.

The message body is :func:`tollway.export.request.encode_message` (``{"v": 1, "export": {...}}``).
The queue is named by ``TOLLWAY_QUEUE_EXPORTS`` (the topology's name for a queue of key
``exports``) and resolved to its URL on first use; the client comes from :func:`tollway.aws.client`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final, Protocol

from tollway import aws
from tollway.exceptions import aws_error_code
from tollway.export.errors import ExportUnavailable

__all__ = ["EXPORT_QUEUE_ENV", "ExportQueue", "MemoryExportQueue", "SqsExportQueue"]

EXPORT_QUEUE_ENV: Final = "TOLLWAY_QUEUE_EXPORTS"


class ExportQueue(Protocol):
    def send(self, body: str) -> str:
        """Enqueue one message; its message id. Raises :class:`ExportUnavailable`."""
        ...


class MemoryExportQueue:
    def __init__(self) -> None:
        self.bodies: list[str] = []

    def send(self, body: str) -> str:
        self.bodies.append(body)
        return f"m{len(self.bodies)}"


class SqsExportQueue:
    """``queue`` is a queue name or URL. ``client`` (a botocore SQS client) is for tests."""

    def __init__(
        self, queue: str, *, endpoint: str | None = None, region: str | None = None, client: Any | None = None
    ) -> None:
        if not queue:
            raise ExportUnavailable(f"{EXPORT_QUEUE_ENV} is not set: it names the export queue")
        self.queue = queue
        self._endpoint = endpoint
        self._region = region
        self._client = client
        self._url = queue if queue.startswith(("https://", "http://")) else None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SqsExportQueue:
        env = os.environ if environ is None else environ
        return cls(
            env.get(EXPORT_QUEUE_ENV, "").strip(),
            endpoint=env.get("AWS_ENDPOINT_URL", "").strip() or None,
            region=env.get("AWS_REGION", "").strip() or env.get("AWS_DEFAULT_REGION", "").strip() or None,
        )

    def _call(self, operation: str, **params: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        if self._client is None:
            self._client = aws.client("sqs", region=self._region, endpoint=self._endpoint)
        try:
            return getattr(self._client, operation)(**params)
        except (ClientError, BotoCoreError) as exc:
            raise ExportUnavailable(f"export queue {self.queue}: {operation} failed: {aws_error_code(exc)}") from None

    def send(self, body: str) -> str:
        if self._url is None:
            self._url = str(self._call("get_queue_url", QueueName=self.queue)["QueueUrl"])
        return str(self._call("send_message", QueueUrl=self._url, MessageBody=body)["MessageId"])
