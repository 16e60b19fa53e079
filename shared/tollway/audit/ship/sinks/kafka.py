"""The Kafka sink, and the consumer the Kafka lane's audit writer reads with."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from types import TracebackType

from tollway.audit.ship.sinks import MESSAGE_HEAD, SinkUnavailable, log

__all__ = ["KafkaAuditConsumer", "KafkaSink"]

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
