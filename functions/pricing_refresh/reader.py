"""Reading pricing sources by URI: ``file://path`` from the function's filesystem, ``s3://bucket/key`` from S3.

Any failure to read a source (missing, denied, too large, an S3 error) is a
:class:`~tollway.pricing.PricingSourceError`: the refresh keeps the last valid snapshot and
reports it, and the next scheduled run tries again.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tollway.exceptions import ConfigIssue
from tollway.pricing import PricingSourceError, SnapshotStoreError
from tollway.pricing.store import MAX_OBJECT_BYTES, read_s3_object

__all__ = ["SourceReader", "UriReader"]


class SourceReader(Protocol):
    def read(self, uri: str) -> bytes:
        """The source's bytes; :class:`PricingSourceError` when it cannot be read."""
        ...


def _unreadable(uri: str, why: str) -> PricingSourceError:
    return PricingSourceError(uri, [ConfigIssue("", why)])


class UriReader:
    """Reads ``file://`` and ``s3://`` URIs; ``s3`` is a boto3 S3 client (or a factory's result)."""

    def __init__(self, s3: Any | None = None, *, limit: int = MAX_OBJECT_BYTES) -> None:
        self._s3 = s3
        self._limit = limit

    def read(self, uri: str) -> bytes:
        if uri.startswith("file://"):
            return self._file(uri, Path(uri[len("file://") :]))
        if uri.startswith("s3://") and self._s3 is not None:
            bucket, _, key = uri[len("s3://") :].partition("/")
            try:
                body = read_s3_object(self._s3, bucket, key, limit=self._limit)
            except SnapshotStoreError as exc:
                raise _unreadable(uri, str(exc).removeprefix(f"{uri}: ").removeprefix(uri).strip(": ")) from None
            if body is None:
                raise _unreadable(uri, "does not exist")
            return body
        raise _unreadable(uri, "unsupported URI scheme")

    def _file(self, uri: str, path: Path) -> bytes:
        try:
            with path.open("rb") as f:
                body = f.read(self._limit + 1)
        except FileNotFoundError:
            raise _unreadable(uri, "does not exist") from None
        except OSError as exc:
            raise _unreadable(uri, f"cannot be read ({type(exc).__name__})") from None
        if len(body) > self._limit:
            raise _unreadable(uri, f"is larger than {self._limit} bytes")
        return body


if TYPE_CHECKING:
    _uri_reader_is_a_source_reader: type[SourceReader] = UriReader
