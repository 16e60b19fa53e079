"""Where the shipper sends audit messages: an SQS queue (the default) or a Kafka topic.

A *message* is one UTF-8 JSON object that the audit writer consumes::

    {"v": 1, "events": [<event JSON object>, ...]}     # 1-64 events, at most 200 KiB

The shipper packs the messages (:mod:`tollway.audit.shipper`); a sink only delivers them. Delivery
is all-or-nothing from the shipper's point of view: :meth:`AuditSink.send` returns once every
message is accepted by the queue, or raises :class:`SinkUnavailable` and the shipper acknowledges
nothing, so the records stay in the WAL and are sent again. A failed call may still have
delivered some messages; the audit writer is idempotent by ``eventId``, so a resend creates no
duplicate row.

The cloud clients (boto3, kafka-python) block and are imported inside the sinks, never at module
level: this module is on the Lambda extension's import path, which has only the standard library,
the core layer and the runtime's boto3.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

from tollway.exceptions import TollwayError

if TYPE_CHECKING:
    from types import TracebackType

__all__ = [
    "MAX_MESSAGE_BYTES",
    "MAX_MESSAGE_EVENTS",
    "MESSAGE_HEAD",
    "MESSAGE_VERSION",
    "AuditSink",
    "KafkaAuditConsumer",
    "KafkaSink",
    "SinkUnavailable",
    "SqsSink",
    "UsageFanOut",
    "usage_messages",
]

log = logging.getLogger("tollway.audit")

MESSAGE_VERSION: Final = 1
MESSAGE_HEAD: Final = b'{"v":%d,"events":[' % MESSAGE_VERSION
"""How the shipper begins every message: its events follow, comma-separated, then ``]}``."""
MAX_MESSAGE_EVENTS: Final = 64
MAX_MESSAGE_BYTES: Final = 200 * 1024
"""Below SQS's historical 256 KiB message limit, which queues created before 2025 still default to."""

SQS_BATCH_ENTRIES: Final = 10
SQS_BATCH_BYTES: Final = 256 * 1024
"""SendMessageBatch's own limits: 10 entries, and a payload no larger than the smallest queue limit."""


class SinkUnavailable(TollwayError):
    """The queue did not accept a batch; nothing of it may be acknowledged in the WAL."""


class AuditSink(Protocol):
    def send(self, batch: list[bytes]) -> None:
        """Deliver every message of ``batch`` (each a message body), or raise :class:`SinkUnavailable`."""
        ...


def usage_messages(batch: Sequence[bytes]) -> list[bytes]:
    """The ``request_finished`` events of ``batch``, in messages of their own (the usage queue's share).

    A message that is not a JSON envelope was already refused by the shipper's packing; it is skipped.
    """
    out: list[bytes] = []
    for body in batch:
        try:
            events = json.loads(body)["events"]
        except (ValueError, LookupError, TypeError):
            continue
        finished = [e for e in events if isinstance(e, dict) and e.get("kind") == "request_finished"]
        if finished:
            out.append(json.dumps({"v": MESSAGE_VERSION, "events": finished}, separators=(",", ":")).encode())
    return out


class UsageFanOut:
    """The audit sink, then the usage queue with each batch's ``request_finished`` events.

    A batch is acknowledged in the WAL only when both accepted it: if the usage queue fails, the
    whole batch is sent again, to both. Duplicates are harmless (the audit store is idempotent by
    ``eventId``, the usage ledger by request id); a lost usage event would not be.
    """

    def __init__(self, audit: AuditSink, usage: AuditSink) -> None:
        self.audit = audit
        self.usage = usage

    def __repr__(self) -> str:
        return f"UsageFanOut({self.audit!r}, usage={self.usage!r})"

    def send(self, batch: list[bytes]) -> None:
        self.send_split(batch, usage_messages(batch))

    def send_split(self, batch: list[bytes], usage: list[bytes]) -> None:
        """``batch`` to the audit sink, then ``usage`` (its ``request_finished`` events, already
        packed by the shipper, which parsed every event anyway) to the usage queue."""
        self.audit.send(batch)
        if usage:
            self.usage.send(usage)


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
    ``AWS_SESSION_TOKEN``); when it has none, boto3's default chain applies. ``endpoint`` is an
    emulator's URL, or ``None`` for AWS. Transport errors are retried by botocore (standard mode,
    bounded); entries a call reports as failed are resent up to ``max_attempts`` times in all.
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
        self._credentials = {
            "aws_access_key_id": env.get("AWS_ACCESS_KEY_ID"),
            "aws_secret_access_key": env.get("AWS_SECRET_ACCESS_KEY"),
            "aws_session_token": env.get("AWS_SESSION_TOKEN"),
        }
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
            import boto3
            from botocore.config import Config

            session = boto3.session.Session(region_name=self._region, **self._credentials)
            config = Config(
                connect_timeout=min(self._timeout_s, 5.0),
                read_timeout=self._timeout_s,
                retries={"max_attempts": 3, "mode": "standard"},
            )
            self._client = session.client("sqs", endpoint_url=self._endpoint, config=config)
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


_DECODER: Final = json.JSONDecoder()


def _first_request_id(body: bytes) -> bytes | None:
    """The Kafka key: the ``requestId`` of the message's first event, so a request's messages share a partition.

    A message the shipper wrote (it starts with ``MESSAGE_HEAD``) has only its first event decoded:
    decoding all of a 200 KiB message with the standard library cost a third of the Kafka
    shipper's CPU (``python -m bench.ship``). Any other body is decoded whole.
    """
    try:
        if body.startswith(MESSAGE_HEAD):
            first, _ = _DECODER.raw_decode(body.decode(), len(MESSAGE_HEAD))
        else:
            first = json.loads(body)["events"][0]
        request_id = first["requestId"]
    except (ValueError, LookupError, TypeError):
        return None
    return request_id.encode() if isinstance(request_id, str) else None


def _servers(bootstrap_servers: str | Sequence[str]) -> list[str]:
    items = bootstrap_servers.split(",") if isinstance(bootstrap_servers, str) else list(bootstrap_servers)
    servers = [s.strip() for s in items if s.strip()]
    if not servers:
        raise ValueError("a Kafka sink needs at least one bootstrap server")
    return servers


class _Clients:
    """A ``kafka_client`` factory that remembers what it built.

    kafka-python's producer and consumer constructors connect to the cluster, and when that fails
    they raise without closing the network client they already made (its sockets and wake-up
    pipe). A shipper retrying against a broker that is down would leak descriptors at every try.
    """

    def __init__(self) -> None:
        self.built: list[Any] = []

    def __call__(self, **configs: Any) -> Any:
        from kafka.net.compat import KafkaNetClient

        client = KafkaNetClient(**configs)
        self.built.append(client)
        return client

    def close(self) -> None:
        for client in self.built:
            client.close()
        self.built.clear()


_crc32c_checked = False


def _check_crc32c() -> bool:
    """Whether kafka-python checksums record batches in C; logs once per process if it does not.

    Without the ``crc32c`` package (``kafka-python[crc32c]``) it computes CRC-32C in pure Python:
    69 ms of CPU for one 8-message send of 512 events, against 11 ms with it (docs/benchmarks.md).
    """
    global _crc32c_checked
    from kafka.record import util

    fast = util.crc32c_c is not None
    if not fast and not _crc32c_checked:
        log.warning("kafka-python is checksumming in pure Python: install kafka-python[crc32c] for the audit sink")
    _crc32c_checked = True
    return fast


class KafkaSink:
    """kafka-python producer with ``acks=all``: one record per message, keyed by its first ``requestId``.

    :meth:`send` flushes and waits for every record's acknowledgement before returning. The
    producer is idempotent (kafka-python's default), which keeps a partition in send order across
    its own retries. It is built on first use and rebuilt after a failure, so records of a failed
    send never linger in its buffer to be delivered behind the shipper's resend.
    """

    def __init__(
        self, bootstrap_servers: str | Sequence[str], topic: str, *, timeout_s: float = 10.0, client_id: str = ""
    ) -> None:
        if not topic:
            raise ValueError("a Kafka sink needs a topic")
        self.servers = _servers(bootstrap_servers)
        self.topic = topic
        self._timeout_s = timeout_s
        self._client_id = client_id or "tollway-wal-shipper"
        self._producer: Any = None

    def __repr__(self) -> str:
        return f"KafkaSink({','.join(self.servers)!r}, {self.topic!r})"

    def connect(self) -> None:
        """Build the producer now if it is not built (its I/O thread starts with it, and takes the
        calling thread's scheduling policy); raises :class:`SinkUnavailable`."""
        self._connect()

    def _connect(self) -> Any:
        if self._producer is None:
            from kafka import KafkaProducer
            from kafka.errors import KafkaError

            _check_crc32c()
            timeout_ms = int(self._timeout_s * 1000)
            clients = _Clients()
            try:
                self._producer = KafkaProducer(
                    bootstrap_servers=self.servers,
                    client_id=self._client_id,
                    acks="all",
                    max_block_ms=timeout_ms,
                    request_timeout_ms=timeout_ms,
                    delivery_timeout_ms=timeout_ms + 5000,
                    bootstrap_timeout_ms=timeout_ms,
                    kafka_client=clients,
                )
            except KafkaError as exc:
                clients.close()
                raise SinkUnavailable(
                    f"Kafka at {','.join(self.servers)} is unavailable: {type(exc).__name__}"
                ) from None
        return self._producer

    def send(self, batch: list[bytes]) -> None:
        if not batch:
            return
        from kafka.errors import KafkaError

        producer = self._connect()
        try:
            futures = [producer.send(self.topic, value=body, key=_first_request_id(body)) for body in batch]
            producer.flush(self._timeout_s)
            for future in futures:
                future.get(self._timeout_s)
        except KafkaError as exc:
            self.close(0)
            raise SinkUnavailable(f"Kafka topic {self.topic} did not acknowledge: {type(exc).__name__}") from None

    def close(self, timeout_s: float | None = None) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.close(self._timeout_s if timeout_s is None else timeout_s)


class KafkaAuditConsumer:
    """Reads audit messages back from the topic: the Kafka lane's test, and a future audit-writer consumer.

    It joins ``group_id`` and starts from the earliest offset the group has not committed;
    :meth:`commit` records what was processed. Use it as a context manager so the group is left.
    """

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        topic: str,
        group_id: str,
        *,
        max_poll_interval_s: float = 30.0,
    ) -> None:
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        interval_ms = int(max_poll_interval_s * 1000)
        self.topic = topic
        clients = _Clients()
        try:
            self._consumer: Any = KafkaConsumer(
                topic,
                bootstrap_servers=_servers(bootstrap_servers),
                group_id=group_id,
                client_id=f"{group_id}-consumer",
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                max_poll_interval_ms=interval_ms,
                session_timeout_ms=min(interval_ms, 10_000),
                heartbeat_interval_ms=min(interval_ms, 10_000) // 4,
                kafka_client=clients,
            )
        except KafkaError as exc:
            clients.close()
            raise SinkUnavailable(f"Kafka at {bootstrap_servers} is unavailable: {type(exc).__name__}") from None

    def poll(self, timeout_s: float) -> list[bytes]:
        """The message bodies fetched within ``timeout_s``, in partition order (empty if none arrived)."""
        fetched = self._consumer.poll(timeout_ms=int(timeout_s * 1000))
        return [record.value for records in fetched.values() for record in records]

    def bodies(self, count: int, timeout_s: float) -> Iterator[bytes]:
        """Yield message bodies until ``count`` have come or ``timeout_s`` has passed, whichever is first."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        while seen < count:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            for body in self.poll(min(left, 0.5)):
                seen += 1
                yield body

    def commit(self) -> None:
        self._consumer.commit()

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> KafkaAuditConsumer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
