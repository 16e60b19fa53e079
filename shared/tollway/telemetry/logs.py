"""Every log line one JSON object, carrying the request and trace ids, and no exception text.

Why JSON: a gateway's stderr is read by machines (CloudWatch Logs Insights, Loki, ``jq``), and a
line that is one object keeps ``extra=`` fields as fields instead of text to parse back out.
``configure_logging`` gives the root logger one handler whose formatter writes ``ts`` (ISO-8601
UTC, milliseconds), ``level``, ``logger``, ``message``, then the call's ``extra=`` fields as
top-level keys, then ``request_id`` and ``trace_id`` when a request is bound in the current
context (an explicit ``extra=`` value of the same name wins), ``worker`` when
``TOLLWAY_WORKER_INDEX`` is set, and ``exc_type`` and ``traceback`` for an exception.

Why the exception's message is never written: it can carry a provider's error text, which may
quote the request (a prompt, a tool argument) or a credential. A traceback keeps its frames and
each exception's type, and drops what Python prints after the type (``ValueError: <message>``
becomes ``ValueError``), its notes and a ``SyntaxError``'s source text; chained exceptions and
exception groups get the same treatment. An exception object passed as an ``extra=`` value is
written as its type name. The ``message`` itself is the caller's: ``log.warning("failed: %s",
exc)`` still writes ``str(exc)``, so log ``exc_info=`` instead.

Why the ids are read by the formatter and not added by a ``logging.Filter``: timed with
``timeit`` (a ``log.info`` with two extras, to a stream that discards, min of 25 runs, on a 2-core
VM where runs differ by a few tenths), a line costs 10.6-10.8 µs through the formatter and
11.2 µs through a filter with a request bound, 10.2-10.3 against 10.4-10.7 µs with none. Alone,
the filter costs 0.57 µs a record (one more Python call, two attributes set on the record) and
the formatter's two ``ContextVar.get`` 0.12 µs. ``basicConfig``'s old text line cost 10.1 µs in
the same runs. The formatter reads the context when it formats, which is the logging call's own
context because the handler is a synchronous ``StreamHandler``; a handler that formats on another
thread (a ``QueueHandler``) would need :class:`RequestContextFilter`, which copies the ids onto
the record at the call.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import Any, Final, Literal, TypeAlias

import orjson
from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.orjson import OrjsonFormatter, orjson_default

__all__ = [
    "LOG_FORMAT_ENV",
    "WORKER_INDEX_ENV",
    "JsonFormatter",
    "LogFormat",
    "RequestContextFilter",
    "RequestTokens",
    "TextFormatter",
    "bind_request",
    "configure_logging",
    "env_log_format",
    "parse_log_format",
    "redacted_traceback",
    "request_context",
    "request_id_var",
    "reset_request",
    "trace_id_var",
]

LogFormat: TypeAlias = Literal["json", "text"]
RequestTokens: TypeAlias = tuple[Token[str | None], Token[str | None]]

LOG_FORMAT_ENV: Final = "TOLLWAY_LOG_FORMAT"
"""Overrides the configured log format (``json`` or ``text``) for every Tollway process."""
WORKER_INDEX_ENV: Final = "TOLLWAY_WORKER_INDEX"
"""Set by ``tollway serve`` in each worker process; written as ``worker`` when set."""

request_id_var: Final[ContextVar[str | None]] = ContextVar("tollway_request_id", default=None)
"""The request being served in this context (``req_<24 hex>``), or None outside a request."""
trace_id_var: Final[ContextVar[str | None]] = ContextVar("tollway_trace_id", default=None)
"""The request's trace id (32 hex), or None when the request is not traced or none is bound."""

_HANDLER_NAME: Final = "tollway"
_TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"
_BASE_KEYS: Final = frozenset({"ts", "level", "logger", "message", "worker", "exc_type", "traceback", "stack"})
# LogRecord's own attributes are not extras; ``color_message`` is uvicorn's ANSI copy of its message.
_NOT_EXTRA: Final = frozenset(RESERVED_ATTRS) | {"taskName", "color_message"}
_MAX_GROUP_WIDTH: Final = 15
_MAX_GROUP_DEPTH: Final = 10
_CAUSE: Final = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT: Final = "\nDuring handling of the above exception, another exception occurred:\n\n"


def bind_request(request_id: str, trace_id: str | None = None) -> RequestTokens:
    """Bind the request's ids to the current context; pass the result to :func:`reset_request`.

    Tasks created afterwards copy the context, so the ids follow the request into them; a
    binding made inside a task stays in that task.
    """
    return request_id_var.set(request_id), trace_id_var.set(trace_id)


def reset_request(tokens: RequestTokens) -> None:
    """Undo :func:`bind_request`, restoring whatever was bound before it."""
    request_token, trace_token = tokens
    trace_id_var.reset(trace_token)
    request_id_var.reset(request_token)


@contextmanager
def request_context(request_id: str, trace_id: str | None = None) -> Iterator[None]:
    """:func:`bind_request` for the ``with`` block."""
    tokens = bind_request(request_id, trace_id)
    try:
        yield
    finally:
        reset_request(tokens)


class RequestContextFilter(logging.Filter):
    """Copies the bound ids onto each record, for a handler that formats outside the call's context.

    Not installed by :func:`configure_logging`, whose formatter reads the context itself (it is
    cheaper); a ``QueueHandler`` formats on its listener's thread, where the context is not the
    caller's, and needs this on the queue handler. An id already on the record (``extra=``) stays.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = request_id_var.get()
        if request_id is not None and not hasattr(record, "request_id"):
            record.request_id = request_id
        trace_id = trace_id_var.get()
        if trace_id is not None and not hasattr(record, "trace_id"):
            record.trace_id = trace_id
        return True


def _type_name(exc_type: type[BaseException]) -> str:
    """The type as Python's traceback prints it: bare for builtins, else module-qualified."""
    module = exc_type.__module__
    if module in ("builtins", "__main__"):
        return exc_type.__qualname__
    return f"{module}.{exc_type.__qualname__}"


def _chain(exc: BaseException) -> tuple[list[BaseException], list[str]]:
    """``exc`` and the exceptions it was raised from, newest first, and what links each to the next.

    ``links[i]`` is the line Python prints between ``chain[i + 1]`` and the newer ``chain[i]``.
    """
    chain: list[BaseException] = [exc]
    links: list[str] = []
    seen = {id(exc)}
    current = exc
    while True:
        if current.__cause__ is not None:
            older, link = current.__cause__, _CAUSE
        elif current.__context__ is not None and not current.__suppress_context__:
            older, link = current.__context__, _CONTEXT
        else:
            break
        if id(older) in seen:  # a cycle: Python stops there too
            break
        seen.add(id(older))
        chain.append(older)
        links.append(link)
        current = older
    return chain, links


def _one(exc: BaseException, depth: int) -> list[str]:
    """One exception's frames and type, without its message; a group's members indented under it."""
    lines: list[str] = []
    if exc.__traceback__ is not None:
        lines.append("Traceback (most recent call last):\n")
        lines.extend(traceback.format_list(traceback.extract_tb(exc.__traceback__)))
    lines.append(_type_name(type(exc)) + "\n")
    if isinstance(exc, BaseExceptionGroup):
        if depth >= _MAX_GROUP_DEPTH:
            lines.append(f"  +-- ... (max_group_depth is {_MAX_GROUP_DEPTH})\n")
            return lines
        members = exc.exceptions
        for index, member in enumerate(members[:_MAX_GROUP_WIDTH], 1):
            lines.append(f"  +-- {index} --\n")
            for chunk in _render(member, depth + 1):
                lines.extend(f"  | {line}\n" for line in chunk.splitlines())
        if len(members) > _MAX_GROUP_WIDTH:
            lines.append(f"  +-- and {len(members) - _MAX_GROUP_WIDTH} more exceptions --\n")
    return lines


def _render(exc: BaseException, depth: int) -> list[str]:
    """The chain oldest first, as Python prints it."""
    chain, links = _chain(exc)
    lines: list[str] = []
    for position in range(len(chain) - 1, -1, -1):
        lines.extend(_one(chain[position], depth))
        if position > 0:
            lines.append(links[position - 1])
    return lines


def redacted_traceback(exc: BaseException) -> str:
    """The traceback Python would print for ``exc``, minus every message, note and source text.

    What remains is code (file names, line numbers, function names, source lines) and exception
    types, which is what debugging needs; what goes is whatever the exception says, which may be a
    provider's words or the client's.
    """
    return "".join(_render(exc, 0)).rstrip("\n")


def _json_default(obj: Any) -> Any:
    """orjson's fallback: an exception becomes its type name, not the library's ``Type: message``."""
    if isinstance(obj, BaseException):
        return _type_name(type(obj))
    return orjson_default(obj)


def _worker_index() -> int | str | None:
    raw = os.environ.get(WORKER_INDEX_ENV)
    if raw is None or raw == "":
        return None
    return int(raw) if raw.isdigit() else raw


class _Clock:
    """ISO-8601 UTC timestamps with milliseconds; the part up to the second is cached per second."""

    def __init__(self) -> None:
        self._cached: tuple[int, str] = (-1, "")

    def iso(self, created: float) -> str:
        second = int(created)
        cached = self._cached  # one read: another thread may replace the tuple, never half of it
        if cached[0] != second:
            cached = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
            self._cached = cached
        return f"{cached[1]}.{int((created - second) * 1000):03d}Z"


def _exception(record: logging.LogRecord) -> BaseException | None:
    # ``log.exception`` outside an ``except`` block records (None, None, None).
    return record.exc_info[1] if record.exc_info else None


def _fields(record: logging.LogRecord, worker: int | str | None) -> dict[str, Any]:
    """The fields after ``message``: extras in call order, then the bound ids, then the worker."""
    fields: dict[str, Any] = {}
    for key, value in record.__dict__.items():
        if key not in _NOT_EXTRA and key[:1] != "_":
            # An extra named like one of the formatter's own fields is kept, renamed, not dropped.
            fields["extra_" + key if key in _BASE_KEYS else key] = value
    # An id passed as ``extra=`` (or copied by the filter) stays where it is and wins: it names
    # the request the line is about.
    if "request_id" not in fields:
        request_id = request_id_var.get()
        if request_id is not None:
            fields["request_id"] = request_id
    if "trace_id" not in fields:
        trace_id = trace_id_var.get()
        if trace_id is not None:
            fields["trace_id"] = trace_id
    if worker is not None:
        fields["worker"] = worker
    return fields


class JsonFormatter(OrjsonFormatter):
    """One JSON object per record (orjson through python-json-logger's ``OrjsonFormatter``).

    ``format`` is replaced whole rather than extended: the base class would take a traceback from
    ``record.exc_text``, which another formatter may already have filled with the full text.
    """

    def __init__(self, *, worker: int | str | None = None) -> None:
        super().__init__(json_default=_json_default)
        self._worker = worker
        self._clock = _Clock()

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": self._clock.iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        data.update(_fields(record, self._worker))
        exc = _exception(record)
        if exc is not None:
            data["exc_type"] = _type_name(type(exc))
            data["traceback"] = redacted_traceback(exc)
        if record.stack_info:
            data["stack"] = record.stack_info  # frames only: ``stack_info=True`` has no message
        return self.serialize_log_record(data)


def _text_value(value: Any) -> str:
    if isinstance(value, str):
        return value if value and not any(c.isspace() or c in '"=' for c in value) else orjson.dumps(value).decode()
    return orjson.dumps(value, default=_json_default, option=orjson.OPT_NON_STR_KEYS).decode()


class TextFormatter(logging.Formatter):
    """``<ts> <LEVEL> <logger> <message> key=value ...`` for a person at a terminal, redacted the same way."""

    def __init__(self, *, worker: int | str | None = None) -> None:
        super().__init__(_TEXT_FORMAT)
        self._worker = worker
        self._clock = _Clock()

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return self._clock.iso(record.created)

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        record.asctime = self.formatTime(record)
        parts = [self.formatMessage(record)]
        parts.extend(f"{key}={_text_value(value)}" for key, value in _fields(record, self._worker).items())
        line = " ".join(parts)
        exc = _exception(record)
        if exc is not None:  # never ``record.exc_text``: another formatter may have filled it unredacted
            line += "\n" + redacted_traceback(exc)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the time, as logging's last-resort handler does.

    A stream bound when logging is configured outlives a test's captured stderr, or a later
    redirection; the lookup costs one attribute read per line.
    """

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class _Handler(logging.StreamHandler[Any]):
    """The one root handler; a record it cannot format becomes a line that says so, in the same format.

    ``logging.Handler.handleError`` would print the record's message and arguments (which may be
    anything the caller had) and a traceback with the error's text, on stderr as plain text.
    """

    def handleError(self, record: logging.LogRecord) -> None:
        try:
            failed = logging.LogRecord(
                "tollway.logs",
                logging.ERROR,
                record.pathname,
                record.lineno,
                "a record from logger %s could not be written",
                (record.name,),
                sys.exc_info(),
            )
            self.stream.write(self.format(failed) + self.terminator)
            self.flush()
        except Exception:  # nothing left to report it with, and logging must never raise
            pass


def parse_log_format(value: str) -> LogFormat:
    """``json`` or ``text`` (any case, surrounding blanks ignored); ValueError for anything else."""
    normalized = value.strip().lower()
    if normalized == "json":
        return "json"
    if normalized == "text":
        return "text"
    raise ValueError(f"log format must be json or text, not {value!r}")


def env_log_format(default: LogFormat = "json") -> LogFormat:
    """``TOLLWAY_LOG_FORMAT`` when set, else ``default`` (the configuration's ``telemetry.logFormat``).

    Raises ValueError for a value other than ``json`` or ``text``: a typo should stop the process
    with a message, not silently pick a format.
    """
    raw = os.environ.get(LOG_FORMAT_ENV, "")
    if not raw.strip():
        return default
    try:
        return parse_log_format(raw)
    except ValueError:
        raise ValueError(f"{LOG_FORMAT_ENV} must be json or text, not {raw!r}") from None


def configure_logging(
    level: str,
    *,
    fmt: LogFormat = "json",
    access_log: bool = False,
    stream: Any = None,
) -> None:
    """Give the root logger exactly one handler, writing ``fmt`` lines to ``stream``.

    ``stream`` None means whatever ``sys.stderr`` is when each line is written (a default of
    ``sys.stderr`` itself would be the object at import time). Every handler the root logger had is
    removed, so calling this twice, or after ``logging.basicConfig``, leaves one handler. uvicorn's
    ``uvicorn`` and ``uvicorn.error`` loggers lose any handlers they have and propagate here; run
    uvicorn with ``log_config=None``, or its ``dictConfig`` puts its own handler back on them.
    ``tollway.access`` logs at INFO only with ``access_log``; ``httpx`` logs a request per line at
    INFO, so it is held at WARNING.
    """
    fmt = parse_log_format(fmt)
    worker = _worker_index()
    formatter: logging.Formatter = JsonFormatter(worker=worker) if fmt == "json" else TextFormatter(worker=worker)
    handler = _Handler(_CurrentStderr() if stream is None else stream)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        if old.get_name() == _HANDLER_NAME:
            old.close()  # ours: flushes; the stream stays open, it is not ours to close
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        uvicorn_logger = logging.getLogger(name)
        for old in list(uvicorn_logger.handlers):
            uvicorn_logger.removeHandler(old)
        uvicorn_logger.propagate = True
    logging.getLogger("tollway.access").setLevel(logging.INFO if access_log else logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
