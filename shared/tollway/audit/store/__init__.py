"""The audit store: one item per logical request and one per physical attempt, written idempotently by ``eventId``.

Layout, in the audit table (string keys ``pk``/``sk``, TTL attribute ``expiresAt``, index
``by-principal`` on ``principalId``/``ts``)::

    pk = REQ#<requestId>  sk = REQUEST        request_admitted + request_finished, or request_rejected
    pk = REQ#<requestId>  sk = ATTEMPT#0001   attempt_started + attempt_finished metadata

Every item keeps the ids of the events applied to it in ``eventIds``, and every write is
conditioned on its events' ids not being there, so a duplicate delivery changes nothing and
creates nothing. The writer merges a batch's events per item: the events of one item in one queue
batch (several messages) are one update when none of them is stored yet, and a redelivery
converges to the same item however it is batched (:mod:`~tollway.audit.store.plan`,
:mod:`~tollway.audit.store.dynamodb`). Out-of-order delivery converges too: each kind writes its
own attributes, and the attributes two kinds both carry (``rootDigest``, ``routeId``,
``deploymentId``, ``expiresAt``, and all of ``request_rejected``'s but ``rejectedAt``) are owned
by one kind, which sets them, while the other only fills them in when absent (``if_not_exists``).

Which events an item holds shows in its timestamps: ``admittedAt``/``finishedAt`` or
``rejectedAt`` on a request, ``startedAt``/``finishedAt`` on an attempt. No ``finishedAt`` (and no
``rejectedAt``) means incomplete: the gateway crashed, or the terminal event is still in flight.
Only ``request_admitted`` and ``request_rejected`` set the index keys (``principalId``, and ``ts``
as fixed-width ISO-8601 UTC, so string order is time order). A rejected request has no attempts.

``expiresAt`` (epoch seconds) is the owning event's ``ts`` plus the retention
(``TOLLWAY_AUDIT_RETENTION_DAYS``, default 90).

Only the metadata fields the planner names are copied from an event body, with their types
checked: whatever else a body carries is ignored, so no unexpected field (or content) reaches the
table. A malformed event fails its message before anything of that message is written; an unknown
kind is skipped and counted. Readers take the request id from the key and never assume another
attribute is present (:mod:`~tollway.audit.store.views`).

Modules: ``plan`` (events → item writes, no I/O), ``views`` (items → records), ``memory`` and
``dynamodb`` (the two backends of :class:`AuditStore`), ``layout``, ``settings``, ``errors``.
"""

from tollway.audit.store.base import MAX_LIST_LIMIT, ApplyResult, AuditStore
from tollway.audit.store.dynamodb import DynamoDBAuditStore
from tollway.audit.store.errors import AuditStoreError, MalformedEvent
from tollway.audit.store.layout import iso_ts
from tollway.audit.store.memory import MemoryAuditStore
from tollway.audit.store.settings import DEFAULT_RETENTION_DAYS, DEFAULT_WRITE_CONCURRENCY, StoreSettings
from tollway.audit.store.views import AttemptView, RequestRecord, RequestView

__all__ = [
    "DEFAULT_RETENTION_DAYS",
    "DEFAULT_WRITE_CONCURRENCY",
    "MAX_LIST_LIMIT",
    "ApplyResult",
    "AttemptView",
    "AuditStore",
    "AuditStoreError",
    "DynamoDBAuditStore",
    "MalformedEvent",
    "MemoryAuditStore",
    "RequestRecord",
    "RequestView",
    "StoreSettings",
    "iso_ts",
]
