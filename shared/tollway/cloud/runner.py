"""The local event-source runner: what Lambda's SQS event source mappings and EventBridge schedules do on AWS.

No emulator here runs Lambda code, so this runner calls the worker handlers in-process with the
events AWS would send them:

- **Queues.** Each :class:`~tollway.cloud.resources.QueueTrigger` becomes a :class:`QueueMapping`.
  It receives up to the batch size within the batching window (ReceiveMessage, at most 10 per call,
  every attribute), hands the handler a real SQS event and a Lambda-like context, and honours
  ``ReportBatchItemFailures`` as Lambda does: the listed items stay on the queue and reappear after
  the visibility timeout, the rest are deleted (DeleteMessageBatch). A raised exception, a timeout
  or an invalid response fails the whole batch.
- **Dead-letter queue.** moto server and LocalStack both apply the queue's RedrivePolicy on
  receive, as SQS does: once a message has been received ``maxReceiveCount`` times, the next
  receive moves it to the DLQ. The runner relies on that. For an endpoint that ignores the
  policy it also emulates it: a message that arrives with ApproximateReceiveCount above the
  spec's ``max_receive_count`` is sent to the DLQ (with a new message id) and deleted, never
  handed to the function.
- **Schedules.** Each :class:`~tollway.cloud.resources.ScheduleTrigger` fires an EventBridge
  Scheduled Event on its ``rate(...)`` or ``cron(...)`` expression (UTC) against an injectable
  :class:`Clock`. Missed occurrences (a stopped laptop) are not backfilled: one event fires for the
  earliest due slot and the schedule resumes after ``now``.

Threads, not asyncio: boto3 is synchronous and handlers are the synchronous Lambda entry points.
Each mapping gets ``max_concurrency`` (default 1) poller threads, so invocations per mapping never
overlap beyond it; schedules fire from one scheduler thread, one invocation at a time.
:meth:`EventSourceRunner.stop` is bounded: pollers long-poll at most ``poll_wait_s``. With a
``drain_s`` it first lets the pollers take what is already on their queues (what a gateway's
audit shipper sent while it stopped), for at most that long, so a local cloud that stops next
does not lose it; it then logs each mapping's counts (handled, retried, left on the queue).

Logs carry function names, queue names, message ids and counts, never message bodies or handler
exception messages (either may carry data that must not leak); tracebacks are logged as frames.

The step API (:meth:`EventSourceRunner.poll_once`, :meth:`EventSourceRunner.fire_due`) drives
the same code deterministically from tests.
"""

from __future__ import annotations

import base64
import calendar
import hashlib
import importlib
import json
import logging
import math
import re
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any, Final, Protocol

from tollway.cloud.bootstrap import BootstrapError, Clients, boto_errors
from tollway.cloud.resources import FunctionSpec, QueueSpec, QueueTrigger, ScheduleTrigger, Topology
from tollway.exceptions import TollwayError

__all__ = [
    "BatchOutcome",
    "Clock",
    "CronSchedule",
    "EventSourceRunner",
    "FunctionBinding",
    "Handler",
    "LambdaContext",
    "MappingCounts",
    "QueueMapping",
    "RateSchedule",
    "RunnerError",
    "ScheduleFiring",
    "ScheduledRule",
    "SystemClock",
    "import_handler",
    "parse_schedule",
    "scheduled_event",
    "sqs_record",
]

log = logging.getLogger("tollway.cloud.runner")

Handler = Callable[[dict[str, Any], Any], Any]
"""A Lambda handler: ``handler(event, context)``."""

_RECEIVE_MAX: Final = 10
_IDLE_S: Final = 0.05
"""Pause between empty receives while a batching window is still open."""
_MAX_RECEIVES_PER_BATCH: Final = 10_000
_ERROR_BACKOFF_S: Final = 1.0
_TRACE_FRAMES: Final = 5


class RunnerError(TollwayError, RuntimeError):
    """A mapping or schedule cannot be set up; the message names the function and the resource."""


# ---------------------------------------------------------------- schedule expressions


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class ScheduleExpression(Protocol):
    def next_after(self, t: datetime) -> datetime:
        """The first occurrence strictly after ``t`` (for a rate: one period after ``t``)."""
        ...


@dataclass(frozen=True, slots=True)
class RateSchedule:
    period: timedelta

    def next_after(self, t: datetime) -> datetime:
        return t + self.period


_RATE = re.compile(r"rate\((\d+) (minute|minutes|hour|hours|day|days)\)")
_UNIT_S: Final = {"minute": 60, "hour": 3600, "day": 86_400}
_MONTHS: Final = {m.upper(): i for i, m in enumerate(calendar.month_abbr) if m}
_DAYS: Final = {"SUN": 1, "MON": 2, "TUE": 3, "WED": 4, "THU": 5, "FRI": 6, "SAT": 7}
_YEARS: Final = (1970, 2199)
_MAX_CRON_SCAN_DAYS: Final = 100_000


def _cron_field(text: str, lo: int, hi: int, names: Mapping[str, int] | None = None) -> frozenset[int]:
    """One AWS cron field: ``*``, numbers or names, ``a-b`` ranges, ``x/step`` and comma lists."""

    def value(token: str) -> int:
        if names and token.upper() in names:
            return names[token.upper()]
        if not token.isdigit():
            if any(c in token.upper() for c in "LW#"):
                raise ValueError(f"{token!r}: L, W and # are not supported by the local runner")
            raise ValueError(f"{token!r} is not a value in {lo}-{hi}")
        n = int(token)
        if not lo <= n <= hi:
            raise ValueError(f"{n} is outside {lo}-{hi}")
        return n

    out: set[int] = set()
    for part in text.split(","):
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) < 1:
                raise ValueError(f"{part!r}: the step must be a positive number")
            step = int(step_text)
        if base == "*":
            first, last = lo, hi
        elif "-" in base:
            a, b = base.split("-", 1)
            first, last = value(a), value(b)
            if first > last:
                raise ValueError(f"{part!r}: the range runs backwards")
        else:
            first = value(base)
            last = hi if slash else first
        out.update(range(first, last + 1, step))
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """An AWS 6-field cron expression (minutes hours day-of-month month day-of-week year), in UTC.

    Day-of-week runs 1-7 from Sunday, as in EventBridge; exactly one of the day fields is ``?``.
    """

    minutes: frozenset[int]
    hours: frozenset[int]
    days_of_month: frozenset[int] | None
    """``None`` for ``?``."""
    months: frozenset[int]
    days_of_week: frozenset[int] | None
    years: frozenset[int]

    @classmethod
    def parse(cls, fields: str) -> CronSchedule:
        parts = fields.split()
        if len(parts) != 6:
            raise ValueError("cron needs 6 fields: minutes hours day-of-month month day-of-week year")
        minute, hour, dom, month, dow, year = parts
        if (dom == "?") == (dow == "?"):
            raise ValueError("exactly one of day-of-month and day-of-week must be '?'")
        for name, text in (("minutes", minute), ("hours", hour), ("month", month), ("year", year)):
            if "?" in text:
                raise ValueError(f"'?' is only allowed in a day field, not in {name}")
        return cls(
            minutes=_cron_field(minute, 0, 59),
            hours=_cron_field(hour, 0, 23),
            days_of_month=None if dom == "?" else _cron_field(dom, 1, 31),
            months=_cron_field(month, 1, 12, _MONTHS),
            days_of_week=None if dow == "?" else _cron_field(dow, 1, 7, _DAYS),
            years=_cron_field(year, *_YEARS),
        )

    def _day_matches(self, day: date) -> bool:
        if self.days_of_month is not None:
            return day.day in self.days_of_month
        assert self.days_of_week is not None
        return day.isoweekday() % 7 + 1 in self.days_of_week

    def next_after(self, t: datetime) -> datetime:
        start = t.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
        times = sorted((h, m) for h in self.hours for m in self.minutes)
        day = start.date()
        for _ in range(_MAX_CRON_SCAN_DAYS):
            if day.year > _YEARS[1]:
                break
            if day.year not in self.years:
                day = date(day.year + 1, 1, 1)
                continue
            if day.month not in self.months:
                day = date(day.year + 1, 1, 1) if day.month == 12 else date(day.year, day.month + 1, 1)
                continue
            if self._day_matches(day):
                floor = (start.hour, start.minute) if day == start.date() else (0, 0)
                hm = next((x for x in times if x >= floor), None)
                if hm is not None:
                    return datetime(day.year, day.month, day.day, hm[0], hm[1], tzinfo=UTC)
            day += timedelta(days=1)
        raise ValueError(f"no occurrence after {t.isoformat()} before {_YEARS[1] + 1}")


def parse_schedule(expression: str) -> RateSchedule | CronSchedule:
    """Parse an EventBridge ``rate(...)`` or ``cron(...)`` expression; ``ValueError`` names what is wrong."""
    text = expression.strip()
    try:
        if text.startswith("rate("):
            m = _RATE.fullmatch(text)
            if m is None:
                raise ValueError("expected rate(N minute[s]|hour[s]|day[s])")
            n, unit = int(m.group(1)), m.group(2)
            if n < 1:
                raise ValueError("the value must be at least 1")
            if (n == 1) != (not unit.endswith("s")):
                raise ValueError("the unit is singular for 1 and plural otherwise, as EventBridge requires")
            return RateSchedule(timedelta(seconds=n * _UNIT_S[unit.rstrip("s")]))
        if text.startswith("cron(") and text.endswith(")"):
            return CronSchedule.parse(text[5:-1])
        raise ValueError("expected rate(...) or cron(...)")
    except ValueError as exc:
        raise ValueError(f"schedule expression {expression!r}: {exc}") from None


# ---------------------------------------------------------------- Lambda shapes


@dataclass(frozen=True, slots=True)
class LambdaContext:
    """The attributes of the Python runtime's context object that handlers (and Powertools) read.

    ``memory_limit_in_mb`` is a string, as the real runtime reads it from the environment.
    """

    aws_request_id: str
    function_name: str
    memory_limit_in_mb: str
    invoked_function_arn: str
    log_group_name: str
    log_stream_name: str
    function_version: str = "$LATEST"
    identity: None = None
    client_context: None = None
    _deadline: float = field(default=0.0, repr=False)
    """``time.monotonic()`` at which the function times out."""

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def _context(fn: FunctionSpec, region: str, account: str) -> LambdaContext:
    request_id = str(uuid.uuid4())
    return LambdaContext(
        aws_request_id=request_id,
        function_name=fn.name,
        memory_limit_in_mb=str(fn.memory_mb),
        invoked_function_arn=f"arn:aws:lambda:{region}:{account}:function:{fn.name}",
        log_group_name=f"/aws/lambda/{fn.name}",
        log_stream_name=f"{datetime.now(UTC):%Y/%m/%d}/[$LATEST]{request_id.replace('-', '')}",
        _deadline=time.monotonic() + fn.timeout_s,
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _lambda_message_attributes(attributes: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """SQS message attributes in Lambda's shape: camelCase, binary as base64, both lists always present."""
    out: dict[str, dict[str, Any]] = {}
    for name, attr in attributes.items():
        shaped: dict[str, Any] = {}
        if "StringValue" in attr:
            shaped["stringValue"] = attr["StringValue"]
        if "BinaryValue" in attr:
            shaped["binaryValue"] = _b64(attr["BinaryValue"])
        shaped["stringListValues"] = list(attr.get("StringListValues", []))
        shaped["binaryListValues"] = [_b64(v) for v in attr.get("BinaryListValues", [])]
        shaped["dataType"] = attr["DataType"]
        out[name] = shaped
    return out


def sqs_record(message: Mapping[str, Any], *, queue_arn: str, region: str) -> dict[str, Any]:
    """One SQS ReceiveMessage result as a record of Lambda's SQS event."""
    record: dict[str, Any] = {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": dict(message.get("Attributes", {})),
        "messageAttributes": _lambda_message_attributes(message.get("MessageAttributes", {})),
        "md5OfBody": message.get("MD5OfBody") or hashlib.md5(message["Body"].encode()).hexdigest(),
    }
    if message.get("MD5OfMessageAttributes"):
        record["md5OfMessageAttributes"] = message["MD5OfMessageAttributes"]
    record |= {"eventSource": "aws:sqs", "eventSourceARN": queue_arn, "awsRegion": region}
    return record


def scheduled_event(*, at: datetime, rule_arn: str, account: str, region: str) -> dict[str, Any]:
    """EventBridge's Scheduled Event for one firing at ``at``."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": account,
        "time": at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [rule_arn],
        "detail": {},
    }


def _failed_ids(response: object, batch_ids: set[str]) -> set[str] | None:
    """The message ids a ``ReportBatchItemFailures`` response leaves on the queue; ``None`` fails the batch.

    As Lambda: no response, an empty object or an empty/null ``batchItemFailures`` is full
    success; an unknown, empty or missing ``itemIdentifier`` (or a response that is not an
    object) is a failure of the whole batch.
    """
    if response is None:
        return set()
    if not isinstance(response, Mapping):
        return None
    failures = response.get("batchItemFailures")
    if failures is None:
        return set()
    if not isinstance(failures, list):
        return None
    ids: set[str] = set()
    for item in failures:
        ident = item.get("itemIdentifier") if isinstance(item, Mapping) else None
        if not isinstance(ident, str) or ident not in batch_ids:
            return None
        ids.add(ident)
    return ids


def _frames(exc: BaseException) -> str:
    """Where an exception was raised, without its message (which may quote message content)."""
    tb = traceback.extract_tb(exc.__traceback__)[-_TRACE_FRAMES:]
    return " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}" for f in reversed(tb))


def import_handler(path: str) -> Handler:
    """``package.module.function`` → the function (Lambda's handler setting, in dotted form)."""
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ValueError(f"handler {path!r} is not a dotted path module.function")
    handler = getattr(importlib.import_module(module_name), attr)
    if not callable(handler):
        raise TypeError(f"handler {path!r} is not callable")
    fn: Handler = handler
    return fn


# ---------------------------------------------------------------- mappings and rules


@dataclass(frozen=True, slots=True)
class QueueMapping:
    """One SQS event source mapping: a function, one of its queue triggers, and the queue."""

    function: FunctionSpec
    trigger: QueueTrigger
    queue: QueueSpec
    handler: Handler
    queue_url: str
    queue_arn: str

    @property
    def name(self) -> str:
        return f"{self.function.name}<-{self.queue.name}"


@dataclass(slots=True)
class ScheduledRule:
    """One EventBridge schedule of a function; the rule is named after the trigger."""

    function: FunctionSpec
    trigger: ScheduleTrigger
    expression: RateSchedule | CronSchedule
    handler: Handler
    rule_arn: str
    next_fire: datetime


@dataclass(frozen=True, slots=True)
class FunctionBinding:
    mappings: tuple[QueueMapping, ...]
    schedules: tuple[ScheduledRule, ...]


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What one :meth:`EventSourceRunner.poll_once` did (ids only, never bodies)."""

    received: int
    invoked: bool
    deleted: int
    retried: tuple[str, ...]
    """Message ids left on the queue to reappear after the visibility timeout."""
    redriven: tuple[str, ...]
    """Message ids the runner moved to the DLQ itself (see the module docstring)."""
    error: str | None = None
    """Why the whole batch failed: the exception type, ``timeout`` or ``invalid response``."""
    batch_sizes: tuple[int, ...] = ()
    """Messages per ReceiveMessage call, for tests of the batching behaviour."""


@dataclass(slots=True)
class MappingCounts:
    """What one mapping's pollers did since :meth:`EventSourceRunner.start` (message counts)."""

    handled: int = 0
    """Deleted after the function succeeded on them."""
    retried: int = 0
    """Left on the queue by a failed batch or a reported item failure."""
    redriven: int = 0
    """Moved to the DLQ by the runner itself."""


@dataclass(frozen=True, slots=True)
class ScheduleFiring:
    rule: str
    scheduled_time: datetime
    event: dict[str, Any]
    error: str | None


def _validate_trigger(fn: FunctionSpec, trigger: QueueTrigger, queue: QueueSpec) -> None:
    """The checks CreateEventSourceMapping makes, so a bad trigger fails here as it would on deploy."""
    where = f"function {fn.name}, queue {queue.name}"
    if not 1 <= trigger.batch_size <= 10_000:
        raise RunnerError(f"{where}: batch size must be 1-10000")
    if not 0 <= trigger.max_batching_window_s <= 300:
        raise RunnerError(f"{where}: batching window must be 0-300 s")
    if trigger.batch_size > 10 and trigger.max_batching_window_s < 1:
        raise RunnerError(f"{where}: a batch size above 10 needs a batching window of at least 1 s")
    if trigger.max_concurrency is not None and not 2 <= trigger.max_concurrency <= 1000:
        raise RunnerError(f"{where}: maximum concurrency must be 2-1000")
    if queue.visibility_timeout_s < fn.timeout_s:
        raise RunnerError(
            f"{where}: visibility timeout {queue.visibility_timeout_s} s is less than the function timeout"
            f" {fn.timeout_s} s"
        )


class EventSourceRunner:
    """Polls queues and fires schedules for the functions of a topology (and programmatic ones).

    ``load_functions=False`` skips ``topo.functions``, for tests that register their own handlers
    with :meth:`add_function`. ``env``: see :class:`tollway.cloud.bootstrap.Clients`.
    """

    def __init__(
        self,
        topo: Topology,
        *,
        endpoint: str,
        region: str,
        env: Mapping[str, str] | None = None,
        clock: Clock | None = None,
        poll_wait_s: int = 1,
        load_functions: bool = True,
    ) -> None:
        if not 0 <= poll_wait_s <= 20:
            raise ValueError("poll_wait_s must be 0-20 (SQS long-poll limits)")
        self.topology = topo
        self.region = region
        self.clock: Clock = clock or SystemClock()
        self._clients = Clients(endpoint, region, env)
        self._sqs = self._clients.client("sqs")
        self.account = self._clients.account()
        self._poll_wait_s = poll_wait_s
        self._mappings: list[QueueMapping] = []
        self._rules: list[ScheduledRule] = []
        self._dlq_urls: dict[str, str] = {}
        self._schedule_lock = threading.Lock()
        self._stop = threading.Event()
        self._draining = threading.Event()
        self._drain_deadline = 0.0
        self._counts: dict[str, MappingCounts] = {}
        self._counts_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        if load_functions:
            for fn in topo.functions:
                self.add_function(fn)

    @property
    def endpoint(self) -> str:
        return self._clients.endpoint

    @property
    def mappings(self) -> tuple[QueueMapping, ...]:
        return tuple(self._mappings)

    @property
    def schedules(self) -> tuple[ScheduledRule, ...]:
        return tuple(self._rules)

    def counts(self) -> dict[str, MappingCounts]:
        """A copy of each mapping's counts, by :attr:`QueueMapping.name`."""
        with self._counts_lock:
            return {name: MappingCounts(c.handled, c.retried, c.redriven) for name, c in self._counts.items()}

    def _count(self, mapping: QueueMapping, outcome: BatchOutcome) -> None:
        with self._counts_lock:
            counts = self._counts.setdefault(mapping.name, MappingCounts())
            counts.handled += outcome.deleted
            counts.retried += len(outcome.retried)
            counts.redriven += len(outcome.redriven)

    def _visible(self, mapping: QueueMapping) -> int:
        """Messages ready to receive on the mapping's queue (in flight ones are not counted)."""
        attrs = self._sqs.get_queue_attributes(
            QueueUrl=mapping.queue_url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        return int(attrs.get("ApproximateNumberOfMessages", "0"))

    def add_function(self, fn: FunctionSpec, handler: Handler | str | None = None) -> FunctionBinding:
        """Register every queue trigger and schedule of ``fn``; ``handler`` overrides ``fn.handler``."""
        if self._threads:
            raise RunnerError("add functions before start()")
        if callable(handler):
            call = handler
        else:
            path = handler or fn.handler
            try:
                call = import_handler(path)
            except (ImportError, AttributeError, ValueError, TypeError) as exc:
                raise RunnerError(f"function {fn.name}: cannot load handler {path!r}: {exc}") from exc
        mappings = tuple(self._add_mapping(fn, t, call) for t in fn.triggers)
        rules = tuple(self._add_rule(fn, s, call) for s in fn.schedules)
        return FunctionBinding(mappings, rules)

    def _add_mapping(self, fn: FunctionSpec, trigger: QueueTrigger, handler: Handler) -> QueueMapping:
        try:
            queue = self.topology.queue(trigger.queue)
        except KeyError:
            raise RunnerError(f"function {fn.name}: no queue {trigger.queue!r} in the topology") from None
        _validate_trigger(fn, trigger, queue)
        try:
            with boto_errors("queue", queue.name, self.endpoint):
                url = str(self._sqs.get_queue_url(QueueName=queue.name)["QueueUrl"])
                attrs = self._sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]
        except BootstrapError as exc:
            raise RunnerError(f"function {fn.name}: {exc} (has the bootstrap run?)") from None
        mapping = QueueMapping(fn, trigger, queue, handler, url, str(attrs["QueueArn"]))
        self._mappings.append(mapping)
        return mapping

    def _add_rule(self, fn: FunctionSpec, trigger: ScheduleTrigger, handler: Handler) -> ScheduledRule:
        try:
            expression = parse_schedule(trigger.expression)
        except ValueError as exc:
            raise RunnerError(f"function {fn.name}, schedule {trigger.name}: {exc}") from None
        now = self.clock.now().astimezone(UTC).replace(microsecond=0)
        rule = ScheduledRule(
            function=fn,
            trigger=trigger,
            expression=expression,
            handler=handler,
            rule_arn=f"arn:aws:events:{self.region}:{self.account}:rule/{trigger.name}",
            next_fire=expression.next_after(now),
        )
        self._rules.append(rule)
        return rule

    # ------------------------------------------------------------ queues

    def _receive(self, mapping: QueueMapping, count: int, wait_s: int) -> list[dict[str, Any]]:
        response = self._sqs.receive_message(
            QueueUrl=mapping.queue_url,
            MaxNumberOfMessages=count,
            WaitTimeSeconds=wait_s,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        return list(response.get("Messages", []))

    def _gather(self, mapping: QueueMapping, wait_s: int) -> tuple[list[dict[str, Any]], list[int]]:
        """Receive until the batch is full or the batching window (opened by the first message) ends."""
        batch_size = mapping.trigger.batch_size
        messages: list[dict[str, Any]] = []
        sizes: list[int] = []
        deadline: float | None = None
        for _ in range(_MAX_RECEIVES_PER_BATCH):
            if len(messages) >= batch_size or self._stop.is_set():
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            got = self._receive(mapping, min(_RECEIVE_MAX, batch_size - len(messages)), wait_s if not messages else 0)
            if got:
                sizes.append(len(got))
                messages += got
                if deadline is None:
                    deadline = time.monotonic() + mapping.trigger.max_batching_window_s
            elif deadline is None:
                break
            else:
                self._stop.wait(min(_IDLE_S, max(0.0, deadline - time.monotonic())))
        return messages, sizes

    def _redrive_over_limit(self, mapping: QueueMapping, messages: list[dict[str, Any]]) -> list[str]:
        """Emulate the RedrivePolicy for an endpoint that does not apply it (a no-op on moto and LocalStack)."""
        limit = mapping.queue.max_receive_count
        over = [m for m in messages if int(m.get("Attributes", {}).get("ApproximateReceiveCount", "0")) > limit]
        if not over:
            return []
        dlq = self._dlq_urls.get(mapping.queue.dlq_name)
        if dlq is None:
            dlq = self._dlq_urls[mapping.queue.dlq_name] = str(
                self._sqs.get_queue_url(QueueName=mapping.queue.dlq_name)["QueueUrl"]
            )
        for m in over:
            request: dict[str, Any] = {"QueueUrl": dlq, "MessageBody": m["Body"]}
            if m.get("MessageAttributes"):
                request["MessageAttributes"] = m["MessageAttributes"]
            self._sqs.send_message(**request)
        self._delete(mapping, over)
        ids = [str(m["MessageId"]) for m in over]
        log.warning("%s: moved %d message(s) to %s after %d receives: %s", mapping.name, len(ids), dlq, limit, ids)
        return ids

    def _delete(self, mapping: QueueMapping, messages: list[dict[str, Any]]) -> int:
        deleted = 0
        for start in range(0, len(messages), _RECEIVE_MAX):
            chunk = messages[start : start + _RECEIVE_MAX]
            entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(chunk)]
            response = self._sqs.delete_message_batch(QueueUrl=mapping.queue_url, Entries=entries)
            deleted += len(response.get("Successful", []))
            failed = [chunk[int(f["Id"])]["MessageId"] for f in response.get("Failed", [])]
            if failed:
                log.warning("%s: could not delete %d message(s): %s", mapping.name, len(failed), failed)
        return deleted

    def _invoke(self, fn: FunctionSpec, handler: Handler, event: dict[str, Any], what: str) -> tuple[Any, str | None]:
        """Call the handler as Lambda would; returns (response, error) and logs failures without payloads."""
        context = _context(fn, self.region, self.account)
        started = time.monotonic()
        try:
            response = handler(event, context)
            json.dumps(response)  # Lambda serializes the response; one that cannot be is an error
        except Exception as exc:
            log.error("function %s failed on %s: %s at %s", fn.name, what, type(exc).__name__, _frames(exc))
            return None, type(exc).__name__
        elapsed = time.monotonic() - started
        if elapsed > fn.timeout_s:
            log.error("function %s timed out on %s after %.1f s (timeout %d s)", fn.name, what, elapsed, fn.timeout_s)
            return None, "timeout"
        return response, None

    def poll_once(self, mapping: QueueMapping, *, wait_s: int | None = None) -> BatchOutcome:
        """Receive one batch, invoke the function once, delete what succeeded; never raises for handler errors.

        ``wait_s`` is the long poll for the first message (default: the runner's ``poll_wait_s``).
        """
        messages, sizes = self._gather(mapping, self._poll_wait_s if wait_s is None else wait_s)
        redriven = self._redrive_over_limit(mapping, messages)
        messages = [m for m in messages if m["MessageId"] not in redriven]
        if not messages:
            return BatchOutcome(len(redriven), False, 0, (), tuple(redriven), batch_sizes=tuple(sizes))
        ids = [str(m["MessageId"]) for m in messages]
        event = {"Records": [sqs_record(m, queue_arn=mapping.queue_arn, region=self.region) for m in messages]}
        response, error = self._invoke(
            mapping.function, mapping.handler, event, f"a batch of {len(ids)} from {mapping.queue.name}"
        )
        failed = _failed_ids(response, set(ids)) if error is None else None
        if failed is None and error is None:
            error = "invalid response"
            log.error(
                "function %s returned an invalid batchItemFailures response; the batch of %d is retried",
                mapping.function.name,
                len(ids),
            )
        if failed is None:
            log.warning("%s: batch failed (%s); %d message(s) retried: %s", mapping.name, error, len(ids), ids)
            retried = tuple(ids)
            deleted = 0
        else:
            retried = tuple(i for i in ids if i in failed)
            deleted = self._delete(mapping, [m for m in messages if m["MessageId"] not in failed])
            if retried:
                log.info(
                    "%s: %d of %d message(s) reported failed, retried: %s",
                    mapping.name,
                    len(retried),
                    len(ids),
                    list(retried),
                )
        log.debug("%s: batch of %d, %d deleted", mapping.name, len(ids), deleted)
        return BatchOutcome(len(messages) + len(redriven), True, deleted, retried, tuple(redriven), error, tuple(sizes))

    # ------------------------------------------------------------ schedules

    def fire_due(self, now: datetime | None = None) -> list[ScheduleFiring]:
        """Fire every schedule due at ``now`` (default: the clock) once, then move it past ``now``."""
        at = (now or self.clock.now()).astimezone(UTC)
        due: list[tuple[ScheduledRule, datetime]] = []
        with self._schedule_lock:
            for rule in self._rules:
                if rule.next_fire > at:
                    continue
                slot = rule.next_fire
                following = rule.expression.next_after(slot)
                rule.next_fire = following if following > at else rule.expression.next_after(at)
                due.append((rule, slot))
        fired = []
        for rule, slot in due:
            event = scheduled_event(at=slot, rule_arn=rule.rule_arn, account=self.account, region=self.region)
            _, error = self._invoke(rule.function, rule.handler, event, f"schedule {rule.trigger.name}")
            fired.append(ScheduleFiring(rule.trigger.name, slot, event, error))
        return fired

    def _seconds_to_next_fire(self) -> float:
        with self._schedule_lock:
            nxt = min((r.next_fire for r in self._rules), default=None)
        if nxt is None:
            return math.inf
        return max(0.0, (nxt - self.clock.now().astimezone(UTC)).total_seconds())

    # ------------------------------------------------------------ background

    def _poll_loop(self, mapping: QueueMapping) -> None:
        """Poll until stopped; once draining, until the queue is empty or the drain's time is up."""
        while not self._stop.is_set():
            draining = self._draining.is_set()
            if draining and time.monotonic() >= self._drain_deadline:
                return
            try:
                outcome = self.poll_once(mapping, wait_s=0 if draining else None)
                self._count(mapping, outcome)
                if draining and not outcome.received and not self._visible(mapping):
                    return
            except Exception as exc:
                log.error(
                    "%s: polling failed: %s; retrying in %.0f s", mapping.name, type(exc).__name__, _ERROR_BACKOFF_S
                )
                self._stop.wait(_ERROR_BACKOFF_S)

    def _schedule_loop(self, tick_s: float) -> None:
        while not self._stop.is_set() and not self._draining.is_set():
            try:
                self.fire_due()
            except Exception as exc:
                log.error("schedules failed: %s at %s", type(exc).__name__, _frames(exc))
            self._stop.wait(min(tick_s, self._seconds_to_next_fire()))

    def start(self, *, schedule_tick_s: float = 1.0) -> None:
        """Start one thread per mapping slot (``max_concurrency``, default 1) and one for all schedules.

        ``schedule_tick_s`` bounds how long the scheduler sleeps before rereading the clock.
        """
        if self._threads:
            raise RunnerError("the runner is already started")
        self._stop.clear()
        self._draining.clear()
        for mapping in self._mappings:
            for slot in range(mapping.trigger.max_concurrency or 1):
                self._spawn(f"esm {mapping.name} #{slot}", self._poll_loop, mapping)
        if self._rules:
            self._spawn("schedules", self._schedule_loop, schedule_tick_s)
        log.info(
            "event-source runner: %d mapping(s), %d schedule(s) on %s",
            len(self._mappings),
            len(self._rules),
            self.endpoint,
        )

    def _spawn(self, name: str, target: Callable[..., None], *args: object) -> None:
        # Daemon threads: a handler stuck past stop()'s bound must not keep the process alive.
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self, timeout_s: float = 10.0, *, drain_s: float = 0.0) -> bool:
        """Stop polling and firing; True when every thread ended.

        With ``drain_s`` the pollers first receive and invoke until their queue has no visible
        message, for at most ``drain_s``; no schedule fires meanwhile. Then the batches in hand
        get up to ``timeout_s`` to finish. Each mapping's counts are logged once stopped.
        """
        started = bool(self._threads)
        deadline = time.monotonic() + timeout_s
        if drain_s > 0 and started:
            self._drain_deadline = time.monotonic() + drain_s
            self._draining.set()
            deadline = self._drain_deadline + timeout_s
            for thread in self._threads:
                if thread.name.startswith("esm "):
                    thread.join(max(0.0, self._drain_deadline + _IDLE_S - time.monotonic()))
        self._stop.set()
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        self._threads = []
        if alive:
            log.warning("event-source runner: still running after %.0f s (a handler in progress): %s", timeout_s, alive)
        if started:
            self._log_counts()
        return not alive

    def _log_counts(self) -> None:
        counts = self.counts()
        for mapping in self._mappings:
            c = counts.get(mapping.name, MappingCounts())
            try:
                left: int | str = self._visible(mapping)
            except Exception as exc:  # the summary must not fail a stop
                left = f"unknown ({type(exc).__name__})"
            log.info(
                "event-source runner stopped: %s: %d handled, %d retried, %d redriven, %s left on the queue",
                mapping.name,
                c.handled,
                c.retried,
                c.redriven,
                left,
            )

    def __enter__(self) -> EventSourceRunner:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
