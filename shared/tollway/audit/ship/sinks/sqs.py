"""The SQS sink: SendMessageBatch within its 10-entry and 256 KiB limits."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from tollway import aws
from tollway.audit.ship.sinks import SQS_BATCH_BYTES, SQS_BATCH_ENTRIES, SinkUnavailable, log

__all__ = ["SqsSink"]

_SQS_FORBIDDEN: Final = re.compile("[\ufffe\uffff]")
"""Characters valid in JSON strings but outside SQS's allowed set; UTF-8 text holds no others."""
_SQS_FORBIDDEN_UTF8: Final = (b"\xef\xbf\xbe", b"\xef\xbf\xbf")


def _sqs_body(body: bytes) -> tuple[str, int]:
    """The message as SQS text, and its size in bytes: a JSON-equivalent escape of the characters
    SQS refuses, so no event can become a message that every retry sends back.

    The bytes are searched first (a memchr-speed scan): the text is rescanned and re-encoded only
    in the rare message that holds such a character."""
    text = body.decode()
    if not any(c in body for c in _SQS_FORBIDDEN_UTF8):
        return text, len(body)
    text = _SQS_FORBIDDEN.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text, len(text.encode())


def _sqs_chunks(batch: Sequence[bytes]) -> Iterator[list[str]]:
    """Split ``batch`` into SendMessageBatch calls: at most 10 entries and 256 KiB each."""
    chunk: list[str] = []
    size = 0
    for text, length in map(_sqs_body, batch):
        if chunk and (len(chunk) == SQS_BATCH_ENTRIES or size + length > SQS_BATCH_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(text)
        size += length
    if chunk:
        yield chunk


class SqsSink:
    """SQS SendMessageBatch, at most 10 messages a call; the queue URL is resolved once.

    ``env`` supplies the credentials (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    ``AWS_SESSION_TOKEN``); when it has none, botocore's default chain applies. ``endpoint`` is an
    emulator's URL, or ``None`` for AWS. Transport errors are retried by botocore (standard mode,
    bounded); entries a call reports as failed are resent up to ``max_attempts`` times in all. The
    client comes from :func:`tollway.aws.client`: sinks of the same settings (the audit and the
    usage queue's) share one.
    """

    def __init__(
        self,
        queue_name: str,
        endpoint: str | None,
        region: str,
        env: Mapping[str, str],
        *,
        max_attempts: int = 3,
        retry_delay_s: float = 0.2,
        timeout_s: float = 10.0,
        client: Any = None,
    ) -> None:
        if not queue_name:
            raise ValueError("SqsSink needs a queue name")
        self.queue_name = queue_name
        self._endpoint = endpoint or None
        self._region = region
        self._credentials = aws.Credentials.from_env(env)
        self._max_attempts = max(1, max_attempts)
        self._retry_delay_s = retry_delay_s
        self._timeout_s = timeout_s
        self._client: Any = client
        """An SQS client to use instead of building one (tests inject fakes)."""
        self._url: str | None = None

    def __repr__(self) -> str:
        return f"SqsSink({self.queue_name!r}, endpoint={self._endpoint!r}, region={self._region!r})"

    def _connect(self) -> tuple[Any, str]:
        """The client and queue URL, built on first use so a queue that is down at start is retried later."""
        if self._client is None:
            self._client = aws.client(
                "sqs",
                region=self._region,
                endpoint=self._endpoint,
                connect_timeout_s=min(self._timeout_s, 5.0),
                read_timeout_s=self._timeout_s,
                retries=3,
                credentials=self._credentials,
            )
        if self._url is None:
            self._url = str(self._call("get_queue_url", QueueName=self.queue_name)["QueueUrl"])
        return self._client, self._url

    def _call(self, operation: str, **params: Any) -> Any:
        """One client call; botocore's errors become :class:`SinkUnavailable` (codes only, no payload)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self._client, operation)(**params)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", "ClientError"))
            if "NonExistentQueue" in code or "QueueDoesNotExist" in code:
                self._url = None  # a recreated queue may have a new URL: resolve it again next time
            raise SinkUnavailable(f"SQS {operation} on {self.queue_name} failed: {code}") from None
        except BotoCoreError as exc:
            raise SinkUnavailable(f"SQS {operation} on {self.queue_name} failed: {type(exc).__name__}") from None

    def send(self, batch: list[bytes]) -> None:
        if not batch:
            return
        _, url = self._connect()
        for chunk in _sqs_chunks(batch):
            self._send_chunk(url, chunk)

    def _send_chunk(self, url: str, chunk: list[str]) -> None:
        pending = {str(i): body for i, body in enumerate(chunk)}
        for attempt in range(1, self._max_attempts + 1):
            entries = [{"Id": entry_id, "MessageBody": body} for entry_id, body in pending.items()]
            response = self._call("send_message_batch", QueueUrl=url, Entries=entries)
            failed = response.get("Failed") or []
            if not failed:
                return
            codes = sorted({str(f.get("Code", "?")) for f in failed})
            pending = {f["Id"]: pending[f["Id"]] for f in failed}
            if attempt < self._max_attempts:
                log.warning("SQS refused %d of %d audit messages (%s); resending", len(failed), len(entries), codes)
                time.sleep(self._retry_delay_s * attempt)
        raise SinkUnavailable(
            f"SQS kept refusing {len(pending)} audit messages on {self.queue_name} after {self._max_attempts} tries: "
            f"{', '.join(codes)}"
        )
