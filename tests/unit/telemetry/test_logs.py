"""Log lines: one JSON object each, the request's ids when bound, and no exception text anywhere."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tollway import cli
from tollway.telemetry import logs
from tollway.telemetry.logs import (
    RequestContextFilter,
    bind_request,
    configure_logging,
    env_log_format,
    redacted_traceback,
    request_context,
    reset_request,
)

# Built at run time so that no source line a traceback quotes contains them.
SECRET = "sk-canary-" + str(123)
PROMPT = "tell me the " + "launch codes"
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
RID = "req_" + "a" * 24
TID = "b" * 32

log = logging.getLogger("tollway.test")


class ProviderError(Exception):
    """Stands for an upstream error whose text quotes the provider, and through it the request."""


@pytest.fixture(autouse=True)
def isolated_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Put back the root handlers (pytest's own among them), levels and uvicorn's loggers."""
    monkeypatch.delenv(logs.WORKER_INDEX_ENV, raising=False)
    monkeypatch.delenv(logs.LOG_FORMAT_ENV, raising=False)
    root = logging.getLogger()
    names = ("uvicorn", "uvicorn.error", "uvicorn.access", "tollway.access", "httpx")
    saved = [(logging.getLogger(n), list(logging.getLogger(n).handlers), logging.getLogger(n).propagate) for n in names]
    levels = {n: logging.getLogger(n).level for n in names}
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        for logger, its_handlers, propagate in saved:
            logger.handlers[:] = its_handlers
            logger.propagate = propagate
            logger.setLevel(levels[logger.name])


Capture = Callable[..., io.StringIO]


@pytest.fixture
def capture() -> Capture:
    def configure(level: str = "info", **kwargs: Any) -> io.StringIO:
        stream = io.StringIO()
        configure_logging(level, stream=stream, **kwargs)
        return stream

    return configure


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    """Every line, each parsed on its own: a line that is not one JSON object fails here."""
    text = stream.getvalue()
    assert text.endswith("\n")
    parsed = [json.loads(line) for line in text.splitlines()]
    assert all(isinstance(obj, dict) for obj in parsed)
    return parsed


def raise_provider_error() -> None:
    raise ProviderError(f"provider said: invalid key {SECRET} for {PROMPT!r}")


def test_every_line_is_one_json_object(capture: Capture) -> None:
    out = capture("debug")
    log.debug("debug line")
    log.info("two\nlines in one message, %s", "formatted")
    log.warning("a warning")
    try:
        raise_provider_error()
    except ProviderError:
        log.exception("upstream failed")

    records = lines(out)

    assert [r["level"] for r in records] == ["DEBUG", "INFO", "WARNING", "ERROR"]
    assert all(TS.match(r["ts"]) for r in records), [r["ts"] for r in records]
    assert {r["logger"] for r in records} == {"tollway.test"}
    assert records[1]["message"] == "two\nlines in one message, formatted"
    assert list(records[0]) == ["ts", "level", "logger", "message"]


def test_the_ids_are_on_the_lines_logged_inside_a_bound_request_only(capture: Capture) -> None:
    out = capture()
    log.info("before")
    tokens = bind_request(RID, TID)
    log.info("inside")
    reset_request(tokens)
    with request_context(RID):  # not traced: no trace id
        log.info("untraced")
    log.info("after")

    before, inside, untraced, after = lines(out)

    assert "request_id" not in before and "trace_id" not in before
    assert inside["request_id"] == RID and inside["trace_id"] == TID
    assert untraced["request_id"] == RID and "trace_id" not in untraced
    assert "request_id" not in after and "trace_id" not in after


async def test_the_ids_follow_each_request_into_its_tasks_and_stay_there(capture: Capture) -> None:
    out = capture()

    async def request(rid: str, gate: asyncio.Event, other: asyncio.Event) -> None:
        with request_context(rid, rid.replace("req_", "t_")):
            log.info("start")
            other.set()
            await gate.wait()  # the other request logs in between
            await asyncio.create_task(child())
            log.info("end")

    async def child() -> None:
        log.info("in a task")

    a_gate, b_gate = asyncio.Event(), asyncio.Event()
    await asyncio.gather(request("req_a", a_gate, b_gate), request("req_b", b_gate, a_gate))
    log.info("outside")

    records = lines(out)

    for rid in ("req_a", "req_b"):
        mine = [r for r in records if r.get("request_id") == rid]
        assert [r["message"] for r in mine] == ["start", "in a task", "end"]
        assert {r["trace_id"] for r in mine} == {rid.replace("req_", "t_")}
    assert "request_id" not in records[-1] and records[-1]["message"] == "outside"


async def test_a_task_created_before_the_binding_does_not_see_it(capture: Capture) -> None:
    out = capture()
    started = asyncio.Event()
    release = asyncio.Event()

    async def early() -> None:
        started.set()
        await release.wait()
        log.info("early task")

    task = asyncio.create_task(early())
    await started.wait()
    with request_context(RID, TID):
        release.set()
        await task

    [record] = lines(out)
    assert "request_id" not in record


def test_extra_fields_become_top_level_keys(capture: Capture) -> None:
    out = capture()
    attempts = [("route-a", "ok", None)]
    log.info("request", extra={"status": 200, "alias": "chat-fast-v1", "stream": False, "attempts": attempts})
    with request_context(RID, TID):
        log.info("explicit", extra={"request_id": "req_other"})
    log.info("clash", extra={"level": "mine", "ts": 1})

    request, explicit, clash = lines(out)

    assert request["status"] == 200 and request["alias"] == "chat-fast-v1" and request["stream"] is False
    assert request["attempts"] == [["route-a", "ok", None]]
    assert explicit["request_id"] == "req_other" and explicit["trace_id"] == TID
    assert list(explicit)[4:] == ["request_id", "trace_id"]
    assert list(request)[4:] == ["status", "alias", "stream", "attempts"]  # in the caller's order
    assert clash["level"] == "INFO" and clash["extra_level"] == "mine" and clash["extra_ts"] == 1


def test_uvicorns_colour_copy_of_its_message_is_not_a_field(capture: Capture) -> None:
    out = capture()
    logging.getLogger("uvicorn.error").warning("Started server process [%d]", 1, extra={"color_message": "\x1b[36m"})
    [record] = lines(out)
    assert "color_message" not in record and record["logger"] == "uvicorn.error"


def test_an_exception_shows_its_type_and_frames_and_never_its_message(capture: Capture) -> None:
    out = capture()
    try:
        raise_provider_error()
    except ProviderError as exc:
        exc.add_note(f"while sending {PROMPT}")
        log.exception("upstream failed")
        log.warning("as a field", extra={"error": exc})

    text = out.getvalue()
    failed, field = lines(out)

    assert SECRET not in text and PROMPT not in text
    assert failed["message"] == "upstream failed"
    assert failed["exc_type"].endswith("ProviderError")
    tb = failed["traceback"].splitlines()
    assert tb[0] == "Traceback (most recent call last):"
    assert any("in raise_provider_error" in line for line in tb) and any("raise ProviderError(" in line for line in tb)
    assert tb[-1] == failed["exc_type"]
    assert field["error"] == failed["exc_type"]


def test_log_exception_outside_an_except_block_adds_no_exception_fields(capture: Capture) -> None:
    out = capture()
    log.exception("nothing raised")
    [record] = lines(out)
    assert "exc_type" not in record and "traceback" not in record


def test_chained_exceptions_keep_each_type_and_lose_each_message(capture: Capture) -> None:
    out = capture()
    try:
        try:
            raise_provider_error()
        except ProviderError:
            raise KeyError(PROMPT)  # noqa: B904 - the implicit chain is what this test needs
    except KeyError as implicit:
        try:
            raise RuntimeError(f"wrapped: {SECRET}") from implicit
        except RuntimeError:
            log.exception("chained")

    text = out.getvalue()
    [record] = lines(out)
    tb = record["traceback"]

    assert SECRET not in text and PROMPT not in text
    assert record["exc_type"] == "RuntimeError"
    assert tb.count("Traceback (most recent call last):") == 3
    assert "During handling of the above exception, another exception occurred:" in tb
    assert "The above exception was the direct cause of the following exception:" in tb
    types = [line for line in tb.splitlines() if line in ("KeyError", "RuntimeError") or line.endswith("ProviderError")]
    assert [t.rsplit(".", 1)[-1] for t in types] == ["ProviderError", "KeyError", "RuntimeError"]


def test_an_exception_group_keeps_its_members_types_and_loses_their_messages(capture: Capture) -> None:
    out = capture()
    try:
        raise ExceptionGroup(f"group {SECRET}", [ValueError(SECRET), KeyError(PROMPT)])
    except ExceptionGroup:
        log.exception("group")

    text = out.getvalue()
    [record] = lines(out)

    assert SECRET not in text and PROMPT not in text
    assert record["exc_type"] == "ExceptionGroup"
    assert "  | ValueError" in record["traceback"] and "  | KeyError" in record["traceback"]


def test_a_syntax_error_loses_its_source_text() -> None:
    try:
        compile(f"x = = '{SECRET}'", "<request>", "exec")
    except SyntaxError as exc:
        rendered = redacted_traceback(exc)
    assert SECRET not in rendered and rendered.splitlines()[-1] == "SyntaxError"


def test_configuring_twice_leaves_one_handler(capture: Capture) -> None:
    logging.basicConfig(format="%(message)s")  # a handler someone else added goes too
    capture()
    out = capture()

    log.warning("once")

    assert len(logging.getLogger().handlers) == 1
    assert [r["message"] for r in lines(out)] == ["once"]


def test_uvicorns_loggers_go_through_the_one_handler(capture: Capture) -> None:
    import uvicorn

    uvicorn_logger = logging.getLogger("uvicorn")
    uvicorn_logger.addHandler(logging.StreamHandler(io.StringIO()))
    uvicorn_logger.propagate = False
    out = capture()
    # As the gateway's worker builds it; ``log_config=None`` keeps uvicorn from installing its own.
    uvicorn.Config(app=lambda: None, factory=True, log_level="warning", access_log=False, log_config=None)

    logging.getLogger("uvicorn.error").error("Exception in ASGI application")
    logging.getLogger("uvicorn.error").info("Started server process")  # below uvicorn's log_level

    [record] = lines(out)
    assert record["logger"] == "uvicorn.error" and record["level"] == "ERROR"
    assert not uvicorn_logger.handlers and not logging.getLogger("uvicorn.error").handlers


def test_uvicorns_default_log_config_would_install_its_own_handler(capture: Capture) -> None:
    """Why the worker must pass ``log_config=None``: the default puts a text handler back."""
    import uvicorn

    capture()
    uvicorn.Config(app=lambda: None, factory=True, log_level="warning", access_log=False)

    assert logging.getLogger("uvicorn").handlers and not logging.getLogger("uvicorn").propagate


@pytest.mark.parametrize("access_log", [True, False])
def test_the_access_log_and_httpx_levels(capture: Capture, access_log: bool) -> None:
    capture(access_log=access_log)
    assert logging.getLogger("tollway.access").level == (logging.INFO if access_log else logging.WARNING)
    assert logging.getLogger("httpx").level == logging.WARNING


def test_the_worker_index_is_on_every_line_when_set(capture: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(logs.WORKER_INDEX_ENV, "3")
    out = capture()
    log.info("from a worker")
    [record] = lines(out)
    assert record["worker"] == 3


def test_the_text_format_is_for_people_and_redacts_the_same(capture: Capture) -> None:
    out = capture(fmt="text")
    with request_context(RID, TID):
        log.info("request", extra={"status": 200, "alias": "chat fast"})
    try:
        raise_provider_error()
    except ProviderError:
        log.exception("upstream failed")

    text = out.getvalue()
    first, *rest = text.splitlines()

    ts, level, logger, rest_of_line = first.split(" ", 3)
    assert TS.match(ts) and level == "INFO" and logger == "tollway.test"
    assert rest_of_line == 'request status=200 alias="chat fast" request_id=' + RID + " trace_id=" + TID
    assert SECRET not in text and PROMPT not in text
    assert "Traceback (most recent call last):" in rest and rest[-1].endswith("ProviderError")
    assert any("in raise_provider_error" in line for line in rest)


def test_a_record_that_cannot_be_formatted_becomes_a_json_line_without_its_arguments(capture: Capture) -> None:
    out = capture()
    log.info("%d tokens", SECRET)  # a caller's bug: logging would print the arguments to stderr

    text = out.getvalue()
    [record] = lines(out)

    assert SECRET not in text
    assert record["logger"] == "tollway.logs" and record["level"] == "ERROR"
    assert record["message"] == "a record from logger tollway.test could not be written"
    assert record["exc_type"] == "TypeError"


def test_by_default_lines_go_to_the_stderr_of_the_moment(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info")
    log.info("to stderr")
    [line] = capsys.readouterr().err.splitlines()
    assert json.loads(line)["message"] == "to stderr"


def test_the_filter_copies_the_ids_for_a_handler_on_another_thread() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    explicit = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    explicit.request_id = "req_explicit"
    with request_context(RID, TID):
        assert RequestContextFilter().filter(record) and RequestContextFilter().filter(explicit)
    assert (vars(record)["request_id"], vars(record)["trace_id"]) == (RID, TID)
    assert (vars(explicit)["request_id"], vars(explicit)["trace_id"]) == ("req_explicit", TID)


def test_tollway_log_format_overrides_and_a_bad_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    assert env_log_format("json") == "json"
    monkeypatch.setenv(logs.LOG_FORMAT_ENV, " TEXT ")
    assert env_log_format("json") == "text"
    monkeypatch.setenv(logs.LOG_FORMAT_ENV, "xml")
    with pytest.raises(ValueError, match="TOLLWAY_LOG_FORMAT must be json or text"):
        env_log_format()
    with pytest.raises(ValueError, match="log format must be json or text"):
        configure_logging("info", fmt="xml")  # type: ignore[arg-type]


def test_the_cli_configures_json_and_honours_the_override(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cli._configure_logging("info", True)
    logging.getLogger("tollway.access").info("request", extra={"status": 200})
    assert json.loads(capsys.readouterr().err)["status"] == 200

    monkeypatch.setenv(logs.LOG_FORMAT_ENV, "text")
    cli._configure_logging("info", False, "json")
    assert isinstance(logging.getLogger().handlers[0].formatter, logs.TextFormatter)

    monkeypatch.setenv(logs.LOG_FORMAT_ENV, "xml")
    with pytest.raises(SystemExit) as exited:
        cli._configure_logging("info", False)
    assert exited.value.code == 2
    assert capsys.readouterr().err == "tollway: error: TOLLWAY_LOG_FORMAT must be json or text, not 'xml'\n"
