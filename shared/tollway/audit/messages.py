"""The audit and usage queues' message format, as the WAL shipper sends it::

    {"v": 1, "events": [<event object>, ...]}

UTF-8 JSON, 1 to 64 events in WAL order; each event object is exactly what
:meth:`tollway.audit.events.AuditEvent.encode` produces, decoded by
:func:`tollway.audit.events.decode_event`. A message is the unit of failure: one bad event fails
its whole message, which is retried and, past the queue's maxReceiveCount, dead-lettered intact.

The shipper writes the envelope with the standard library (``tollway.audit.ship.sinks``: the Lambda
extension has nothing else); the consumers read it here, in the core layer both functions share.
"""

from __future__ import annotations

from typing import Final

import orjson

from tollway.audit.events import AuditEvent, decode_event
from tollway.exceptions import TollwayError

__all__ = ["MAX_EVENTS", "MESSAGE_VERSION", "MalformedMessage", "decode_message"]

MESSAGE_VERSION: Final = 1
MAX_EVENTS: Final = 64


class MalformedMessage(TollwayError, ValueError):
    """A message that is not a version-1 batch of valid events.

    The text names the position and the rule broken, never a value from the message: it reaches
    logs, and a message body must not.
    """


def decode_message(body: str | bytes) -> list[AuditEvent]:
    """The events of one message, in order; raises :class:`MalformedMessage`."""
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise MalformedMessage("the body is not JSON") from None
    if not isinstance(raw, dict) or type(raw.get("v")) is not int or raw["v"] != MESSAGE_VERSION:
        raise MalformedMessage(f"the body is not a version-{MESSAGE_VERSION} batch object")
    items = raw.get("events")
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_EVENTS:
        raise MalformedMessage(f"'events' must be a list of 1-{MAX_EVENTS} events")
    events = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise MalformedMessage(f"event {i} is not an object")
        try:
            events.append(decode_event(orjson.dumps(item)))
        except (ValueError, orjson.JSONEncodeError):
            # decode_event's text may quote a field value; keep it out of the logs.
            raise MalformedMessage(f"event {i} is not a valid schema-1 audit event") from None
    return events
