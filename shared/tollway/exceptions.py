"""Tollway's one exception hierarchy.

Every error a client can see is a ``GatewayError``: it carries the HTTP status and the
normalized OpenAI-envelope ``code`` (docs/compatibility.md, *Errors*), and a message that is
safe to show (no provider name, physical model, URL, key id or raw provider body).

``UpstreamError`` is what a transport or codec reports about one physical attempt. It is
typed by ``category`` so the retry coordinator decides without string heuristics, and it is
translated into a client-facing ``GatewayError`` only at the end of the attempt budget.

::

    TollwayError
    ├── ConfigError                      invalid llm-router.yml (carries every issue with its path)
    ├── GatewayError                     client-visible, rendered as the OpenAI error envelope
    │   ├── InvalidRequest               400 invalid_request
    │   │   ├── UnsupportedParameter     400 unsupported_parameter
    │   │   ├── ContextLengthExceeded    400 context_length_exceeded
    │   │   ├── ContentFiltered          400 content_filter (a provider's safety or policy refusal)
    │   │   ├── NotFound                 404 not_found (no such path)
    │   │   ├── MethodNotAllowed         405 method_not_allowed
    │   │   └── RequestTimeout           408 request_timeout (the body did not arrive in time)
    │   ├── AuthenticationFailed         401 authentication_error
    │   ├── PermissionDenied             403 permission_denied
    │   ├── ModelNotFound                404 model_not_found
    │   ├── RequestTooLarge              413 request_too_large
    │   ├── UnsupportedMediaType         415 unsupported_media_type
    │   ├── RateLimited                  429 rate_limited
    │   ├── BudgetExceeded               429 budget_exceeded
    │   ├── ProviderFailed               502 provider_error
    │   │   ├── PiiUnresolved            502 pii_unresolved (reject-buffered: a placeholder did not come back)
    │   │   └── StreamInterrupted        the error frame of a stream that fails after its first token
    │   │       ├── StreamCut            upstream_stream_cut (the connection or stream ended early)
    │   │       ├── StreamStalled        upstream_stream_stalled (the provider went silent)
    │   │       └── StreamMalformed      upstream_stream_malformed (events that cannot be decoded)
    │   ├── ModelUnavailable             503 model_unavailable
    │   │   └── UsageUnavailable         503 usage_unavailable (no usage ledger, or it cannot be read)
    │   ├── Overloaded                   503 overloaded (or admission.overloadStatus)
    │   ├── AuditUnavailable             503 audit_unavailable
    │   ├── BudgetUnavailable            503 budget_unavailable (hard limits fail closed)
    │   ├── PiiUnavailable               503 pii_unavailable (the PII vault cannot take a mapping)
    │   └── DeadlineExceeded             504 deadline_exceeded
    ├── UpstreamError                    one attempt failed; typed by UpstreamCategory
    ├── SinkUnavailable                  the audit shipper's queue or topic refused a batch (tollway.audit.ship.sinks)
    ├── SseFrameTooLarge                 one SSE event over the parser's limit (tollway.sse)
    ├── EventStreamError                 an AWS event stream no longer frames (tollway.eventstream)
    │   ├── EventStreamCorrupt           a CRC, a length or a header does not hold
    │   └── EventStreamTooLarge          one message over the parser's limit
    ├── ClientsClosed                    an AWS call after its store was closed (tollway.aws)
    ├── LeaseStoreUnavailable            the quota-leases store failed (tollway.governance.store)
    ├── PricingError                     a pricing source or snapshot is bad or unreadable (tollway.pricing)
    ├── MeteringError                    a usage event, query or ledger failed (tollway.metering.exceptions)
    ├── WalError                         the audit WAL is full, dead, slow or corrupt (tollway.audit.wal.format)
    ├── AuditStoreError                  the audit store could not be read or written (tollway.audit.store.errors)
    ├── ContentError                     captured content could not be handled (tollway.content.base)
    │   └── ContentUnavailable           the content store or KMS failed
    ├── ExportError                      a dataset export failed (tollway.export.errors)
    │   ├── InvalidExportRequest         the request does not parse or is not allowed
    │   ├── ExportConflict               an export id already holds another manifest or shard
    │   ├── ExportIntegrityError         a stored manifest or shard does not match its digest
    │   └── ExportUnavailable            the exports bucket, queue or audit queue failed
    ├── ConformanceStoreError            conformance results could not be read or written (tollway.conformance.store)
    ├── InvalidResult                    a malformed conformance result (tollway.conformance.result)
    ├── NotServed                        a conformance run names no served deployment (tollway.conformance.runner)
    ├── CaseFailed                       one conformance check did not hold (tollway.conformance.runner)
    ├── MalformedEvent                   an audit event the store cannot place (tollway.audit.store.errors)
    ├── MalformedMessage                 an audit or usage queue message that does not decode (tollway.audit.messages)
    ├── BootstrapError                   a local-cloud resource could not be converged (tollway.cloud.bootstrap)
    ├── RunnerError                      a local event-source mapping cannot be set up (tollway.cloud.runner)
    ├── LocalCloudError                  the embedded local cloud did not start (tollway.cloud.local)
    ├── DetectorConfigError              a PII custom pattern or dictionary is unusable (tollway.pii.detectors)
    ├── ConformanceError                 a PII preservation corpus or results file is unusable (tollway.pii.conformance)
    └── VaultError                       the PII vault failed (tollway.pii.vault.base)
        ├── VaultUnavailable             its store or key service failed
        └── TokenExists                  an insert would overwrite a mapping

Errors that are also a standard ``ValueError`` or ``RuntimeError`` keep that base too, so an
``except ValueError`` written before the tree existed still catches them. Which attempts are
retried is not an exception's property: ``tollway.routing.retry`` decides, from the category
and the status.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "AuditUnavailable",
    "AuthenticationFailed",
    "BudgetExceeded",
    "BudgetUnavailable",
    "ConfigError",
    "ConfigIssue",
    "ContentFiltered",
    "ContextLengthExceeded",
    "DeadlineExceeded",
    "GatewayError",
    "InvalidRequest",
    "MethodNotAllowed",
    "ModelNotFound",
    "ModelUnavailable",
    "NotFound",
    "Overloaded",
    "PermissionDenied",
    "PiiUnavailable",
    "PiiUnresolved",
    "ProviderFailed",
    "RateLimited",
    "RequestTimeout",
    "RequestTooLarge",
    "StreamCut",
    "StreamInterrupted",
    "StreamMalformed",
    "StreamStalled",
    "TollwayError",
    "UnsupportedMediaType",
    "UnsupportedParameter",
    "UpstreamCategory",
    "UpstreamError",
    "UsageUnavailable",
    "aws_error_code",
]


class TollwayError(Exception):
    """Root of every error Tollway raises on purpose."""


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    """One validation problem, located by its YAML path (``models[0].routes[1].provider``)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path or '<root>'}: {self.message}"


class ConfigError(TollwayError):
    def __init__(self, issues: list[ConfigIssue]) -> None:
        self.issues = issues
        super().__init__("; ".join(str(i) for i in issues) or "invalid configuration")


class GatewayError(TollwayError):
    status: int = 500
    code: str = "internal_error"
    type: str = "server_error"
    default_message: str = "The gateway could not complete the request."

    def __init__(
        self,
        message: str | None = None,
        *,
        param: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.message = message or self.default_message
        self.param = param
        self.retry_after = retry_after
        super().__init__(self.message)


class InvalidRequest(GatewayError):
    status = 400
    code = "invalid_request"
    type = "invalid_request_error"
    default_message = "The request is invalid."


class UnsupportedParameter(InvalidRequest):
    code = "unsupported_parameter"
    default_message = "The request contains a parameter this model does not support."


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"
    default_message = "The request exceeds the model's context length."


class ContentFiltered(InvalidRequest):
    """The provider refused the request under its content or safety policy. OpenAI's own code
    for it, so a client can tell a refusal from a broken request or a provider fault."""

    code = "content_filter"
    default_message = "The request was rejected by the model provider's content policy."


class NotFound(InvalidRequest):
    """No route for the request's path. An ``invalid_request_error``, like every 4xx of the
    request's own making: the client asked for a path the gateway does not serve."""

    status = 404
    code = "not_found"
    default_message = "Unknown path."


class MethodNotAllowed(InvalidRequest):
    status = 405
    code = "method_not_allowed"
    default_message = "Method not allowed."


class RequestTimeout(InvalidRequest):
    """The client did not send its body within ``bodyReadTimeoutMs``: the request's fault, so an
    ``invalid_request_error``, with HTTP's own status for it."""

    status = 408
    code = "request_timeout"
    default_message = "The request body was not received in time."


class AuthenticationFailed(GatewayError):
    status = 401
    code = "authentication_error"
    type = "authentication_error"
    default_message = "Invalid or missing API key."


class PermissionDenied(GatewayError):
    status = 403
    code = "permission_denied"
    type = "permission_error"
    default_message = "The caller may not perform this request."


class ModelNotFound(GatewayError):
    status = 404
    code = "model_not_found"
    type = "invalid_request_error"
    default_message = "The model does not exist or you do not have access to it."


class RequestTooLarge(GatewayError):
    status = 413
    code = "request_too_large"
    type = "invalid_request_error"
    default_message = "The request body is too large."


class UnsupportedMediaType(GatewayError):
    status = 415
    code = "unsupported_media_type"
    type = "invalid_request_error"
    default_message = "Content-Type must be application/json."


class RateLimited(GatewayError):
    status = 429
    code = "rate_limited"
    type = "rate_limit_error"
    default_message = "Rate limit reached. Retry later."


class BudgetExceeded(GatewayError):
    status = 429
    code = "budget_exceeded"
    type = "insufficient_quota"
    default_message = "The budget for this request's scope is exhausted."


class ProviderFailed(GatewayError):
    status = 502
    code = "provider_error"
    type = "server_error"
    default_message = "The model provider returned an error."


class PiiUnresolved(ProviderFailed):
    """Under ``unresolvedTokenPolicy: reject-buffered``, the answer held a placeholder that did not
    resolve exactly; nothing of it was sent."""

    code = "pii_unresolved"
    default_message = "The model's answer could not be restored exactly; it was withheld."


class StreamInterrupted(ProviderFailed):
    """A stream failed after output had reached the client; only ever sent as its error frame."""


class StreamCut(StreamInterrupted):
    code = "upstream_stream_cut"
    default_message = "The model provider's stream ended before the answer was complete."


class StreamStalled(StreamInterrupted):
    code = "upstream_stream_stalled"
    default_message = "The model provider stopped sending before the answer was complete."


class StreamMalformed(StreamInterrupted):
    code = "upstream_stream_malformed"
    default_message = "The model provider sent stream events that could not be read."


class ModelUnavailable(GatewayError):
    status = 503
    code = "model_unavailable"
    type = "server_error"
    default_message = "The selected model is temporarily unavailable."


class PiiUnavailable(ModelUnavailable):
    """The PII vault cannot record a mapping the request needs: it fails before any provider work."""

    code = "pii_unavailable"
    default_message = "Personal data protection is unavailable right now. Retry shortly."


class UsageUnavailable(ModelUnavailable):
    """``GET /v1/usage`` cannot be answered: no usage ledger is configured, or it cannot be read.
    A ``ModelUnavailable`` by lineage, so it is a 503 ``server_error`` like any other outage."""

    code = "usage_unavailable"
    default_message = "Usage reporting is unavailable right now. Retry shortly."


class Overloaded(GatewayError):
    """Admission sheds the request (no permit free, too much loop lag, a full queue). The status
    is the deployment's choice (``admission.overloadStatus``, 503 or 429), so the constructor
    takes it; the code and type stay ``overloaded`` and ``server_error`` whichever it is."""

    status = 503
    code = "overloaded"
    type = "server_error"
    default_message = "The gateway is overloaded. Retry later."

    def __init__(
        self,
        message: str | None = None,
        *,
        param: str | None = None,
        retry_after: float | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message, param=param, retry_after=retry_after)
        if status is not None:
            self.status = status


class AuditUnavailable(GatewayError):
    """The audit trail cannot take the request's events, so the request fails before dispatch.

    Raised when the WAL is full, its writer is dead, a volume is read-only or full, or a
    local-durable commit times out. Nothing was sent to a provider.
    """

    status = 503
    code = "audit_unavailable"
    type = "server_error"
    default_message = "The gateway cannot record this request right now. Retry later."


class BudgetUnavailable(GatewayError):
    """The shared budget store cannot be reached and the local lease is spent: hard limits fail
    closed, so the request is refused before any provider work."""

    status = 503
    code = "budget_unavailable"
    type = "server_error"
    default_message = "Budgets cannot be checked right now, so the request was not sent. Retry shortly."


class DeadlineExceeded(GatewayError):
    status = 504
    code = "deadline_exceeded"
    type = "server_error"
    default_message = "The request did not complete within its deadline."


class UpstreamCategory(enum.Enum):
    """What went wrong in one physical attempt; decides retry and the client-visible error."""

    AUTHENTICATION = "authentication"
    PERMISSION = "permission"
    RATE_LIMIT = "rate_limit"
    INVALID_REQUEST = "invalid_request"
    CONTEXT_LENGTH = "context_length"
    NOT_FOUND = "not_found"
    SERVER = "server"
    OVERLOADED = "overloaded"
    TIMEOUT = "timeout"
    CONNECT = "connect"
    MALFORMED = "malformed"
    TRUNCATED = "truncated"
    """The body or stream ended before it was complete (a stream before its finish)."""
    SAFETY = "safety"


class UpstreamError(TollwayError):
    """One failed attempt. ``detail`` is for audit/diagnostics only and never reaches a client.

    ``reason`` is the exception: a codec may set it to a normalized, client-safe sentence built
    from a fixed template and values it parsed (token counts, policy category names), never from
    the provider's own text. ``reported`` says the provider itself reported the failure (an error
    status or an error event); otherwise the gateway observed it (a lost connection, silence,
    bytes that do not decode), which is what tells a cut stream from a provider's error event.
    """

    def __init__(
        self,
        category: UpstreamCategory,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        detail: str = "",
        reason: str | None = None,
        reported: bool = False,
    ) -> None:
        self.category = category
        self.status = status
        self.retry_after = retry_after
        self.detail = detail
        self.reason = reason
        self.reported = reported
        super().__init__(f"upstream {category.value}" + (f" (HTTP {status})" if status else ""))

    def to_stream_error(self) -> GatewayError:
        """The error frame a client sees when this ends a stream after its first token: a cut,
        a stall and undecodable events each have their own code; an error the provider reported
        in the stream keeps the code of its category."""
        if not self.reported:
            c = self.category
            if c is UpstreamCategory.TIMEOUT:
                return StreamStalled()
            if c is UpstreamCategory.MALFORMED:
                return StreamMalformed()
            if c in (UpstreamCategory.TRUNCATED, UpstreamCategory.SERVER, UpstreamCategory.CONNECT):
                return StreamCut()
        return self.to_gateway_error()

    def to_gateway_error(self) -> GatewayError:
        """The sanitized error a client sees when this was the last attempt."""
        c = self.category
        if c is UpstreamCategory.CONTEXT_LENGTH:
            return ContextLengthExceeded(self.reason)
        if c is UpstreamCategory.SAFETY:
            return ContentFiltered(self.reason)
        if c is UpstreamCategory.INVALID_REQUEST:
            return InvalidRequest("The model provider rejected the request as invalid.")
        if c is UpstreamCategory.RATE_LIMIT:
            return RateLimited(
                "The model is rate limited. Retry later.",
                retry_after=self.retry_after,
            )
        if c is UpstreamCategory.TIMEOUT:
            return DeadlineExceeded("The model provider did not answer in time.")
        if c in (UpstreamCategory.OVERLOADED, UpstreamCategory.CONNECT):
            return ModelUnavailable(retry_after=self.retry_after)
        return ProviderFailed()


def aws_error_code(exc: BaseException) -> str:
    """The AWS error code of a botocore ``ClientError`` (``ConditionalCheckFailedException``), or the
    exception's type name for any other failure: what error messages and logs may name, never a
    request or response value. Duck-typed, so callers need not import botocore to use it."""
    response = getattr(exc, "response", None)
    error = response.get("Error") if isinstance(response, dict) else None
    code = error.get("Code") if isinstance(error, dict) else None
    return str(code or type(exc).__name__)
