"""One error tree: every public exception class of ``tollway`` is a ``TollwayError``.

The walk imports every module, so a new error class with a separate root fails here wherever it
is defined. ``tollway.mock`` is skipped without being imported: the mock provider stands apart
from the gateway and imports nothing else of ``tollway``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from types import ModuleType

import pytest

import tollway
from tollway.api.errors import error_body, error_headers
from tollway.exceptions import (
    ContextLengthExceeded,
    GatewayError,
    InvalidRequest,
    MethodNotAllowed,
    ModelUnavailable,
    NotFound,
    Overloaded,
    RequestTimeout,
    TollwayError,
    UsageUnavailable,
)

SKIPPED_PACKAGES = ("tollway.mock",)

OUT_OF_TREE: set[str] = set()
"""Known separate roots, each with its reason (none today)."""


def _skipped(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in SKIPPED_PACKAGES)


def _modules() -> Iterator[ModuleType]:
    """Every importable module of ``tollway``, the skipped packages left unimported. A module that
    needs a missing optional extra is left out; a missing ``tollway`` module is a failure."""
    pending = [tollway]
    while pending:
        package = pending.pop()
        yield package
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            if _skipped(info.name):
                continue
            try:
                module = importlib.import_module(info.name)
            except ModuleNotFoundError as exc:
                if (exc.name or "").split(".")[0] == "tollway":
                    raise
                continue
            if info.ispkg:
                pending.append(module)
            else:
                yield module


def _public_exceptions() -> dict[str, type[Exception]]:
    found: dict[str, type[Exception]] = {}
    for module in _modules():
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, Exception)
                and obj.__module__ == module.__name__
                and not name.startswith("_")
            ):
                found[f"{module.__name__}.{name}"] = obj
    return found


def test_the_walk_sees_the_whole_package() -> None:
    found = _public_exceptions()
    # One known class from each corner, so an empty or truncated walk cannot pass vacuously.
    for name in (
        "tollway.exceptions.GatewayError",
        "tollway.audit.wal.format.WalError",
        "tollway.audit.store.errors.AuditStoreError",
        "tollway.metering.exceptions.MeteringError",
        "tollway.pricing.errors.PricingError",
        "tollway.cloud.runner.RunnerError",
    ):
        assert name in found, name
    assert not any(_skipped(n) for n in found)


def test_every_public_exception_is_a_tollway_error() -> None:
    outside = {n for n, cls in _public_exceptions().items() if not issubclass(cls, TollwayError)}
    assert not outside - OUT_OF_TREE, "derive from tollway.exceptions.TollwayError: " + ", ".join(
        sorted(outside - OUT_OF_TREE)
    )


def _patched(
    base: type[GatewayError], message: str, *, retry_after: float | None = None, **attrs: object
) -> GatewayError:
    """How the HTTP handler built these errors before they had classes of their own."""
    err = base(message, retry_after=retry_after)
    for attr, value in attrs.items():
        setattr(err, attr, value)
    return err


@pytest.mark.parametrize(
    ("made", "patched", "lineage"),
    [
        (
            RequestTimeout("The request body was not received in time."),
            _patched(InvalidRequest, "The request body was not received in time.", status=408, code="request_timeout"),
            InvalidRequest,
        ),
        (
            ContextLengthExceeded("The messages exceed your limit of 10 input tokens for this model."),
            _patched(
                InvalidRequest,
                "The messages exceed your limit of 10 input tokens for this model.",
                code="context_length_exceeded",
            ),
            InvalidRequest,
        ),
        (
            UsageUnavailable("Usage reporting is not configured on this gateway."),
            _patched(ModelUnavailable, "Usage reporting is not configured on this gateway.", code="usage_unavailable"),
            ModelUnavailable,
        ),
        (
            UsageUnavailable("The usage ledger cannot be read right now. Retry shortly.", retry_after=1),
            _patched(
                ModelUnavailable,
                "The usage ledger cannot be read right now. Retry shortly.",
                retry_after=1,
                code="usage_unavailable",
            ),
            ModelUnavailable,
        ),
        (
            NotFound("Unknown path."),
            _patched(InvalidRequest, "Unknown path.", status=404, code="not_found"),
            InvalidRequest,
        ),
        (
            MethodNotAllowed("Method not allowed."),
            _patched(InvalidRequest, "Method not allowed.", status=405, code="method_not_allowed"),
            InvalidRequest,
        ),
        (Overloaded(retry_after=1, status=429), _patched(Overloaded, "", retry_after=1, status=429), Overloaded),
        (Overloaded(retry_after=1), _patched(Overloaded, "", retry_after=1), Overloaded),
    ],
)
def test_error_classes_answer_exactly_what_the_patched_errors_did(
    made: GatewayError, patched: GatewayError, lineage: type[GatewayError]
) -> None:
    assert isinstance(made, lineage)
    assert made.status == patched.status
    assert error_body(made) == error_body(patched)
    assert error_headers(made) == error_headers(patched)


def test_overloaded_status_is_per_instance() -> None:
    assert Overloaded(retry_after=1, status=429).status == 429
    assert Overloaded().status == Overloaded.status == 503
