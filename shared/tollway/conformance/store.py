"""Where results are kept: a directory, or an S3 prefix, with the same keys.

``<location>/<provider>/<model>.json`` holds the latest result of each (provider deployment,
physical model) pair, and ``<location>/<provider>/history/<model>/<finished>-<digest>.json`` every
result ever written (a directory of small files, or objects under the prefix). Provider ids and
model ids are percent-encoded in keys (``anthropic.claude-3-5-haiku-20241022-v1%3A0``), so a model
id with ``/`` or ``:`` stays one path segment.

The location comes from ``conformance.results``; empty means ``$TOLLWAY_CONFORMANCE_RESULTS``, else
``.tollway/conformance``. A relative directory is relative to the configuration file's folder, as
``pii.conformanceFile`` is. S3 is reached through ``tollway.aws`` (``AWS_ENDPOINT_URL`` for a local
cloud).
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

from tollway.conformance.result import ConformanceResult, InvalidResult, parse_result
from tollway.exceptions import TollwayError, aws_error_code

__all__ = [
    "DEFAULT_RESULTS",
    "RESULTS_ENV",
    "ConformanceStoreError",
    "DirectoryStore",
    "ResultKey",
    "ResultStore",
    "S3Store",
    "latest_key",
    "open_store",
    "results_location",
]

RESULTS_ENV: Final = "TOLLWAY_CONFORMANCE_RESULTS"
DEFAULT_RESULTS: Final = ".tollway/conformance"
MAX_RESULT_BYTES: Final = 1024 * 1024

ResultKey = tuple[str, str]
"""``(provider deployment id, physical model)``."""


class ConformanceStoreError(TollwayError):
    """The results location cannot be read or written, or holds a result that does not verify.
    The message names the location and key, never a result's content."""


def results_location(configured: str, environ: Mapping[str, str] | None = None) -> str:
    """``conformance.results``, else ``$TOLLWAY_CONFORMANCE_RESULTS``, else :data:`DEFAULT_RESULTS`."""
    env = os.environ if environ is None else environ
    return configured.strip() or env.get(RESULTS_ENV, "").strip() or DEFAULT_RESULTS


def _segment(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def latest_key(deployment: str, model: str) -> str:
    """The key of a pair's latest result, relative to the location."""
    return f"{_segment(deployment)}/{_segment(model)}.json"


def history_key(result: ConformanceResult) -> str:
    finished = datetime.fromtimestamp(result.finished_at, UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return f"{_segment(result.deployment)}/history/{_segment(result.model)}/{finished}-{result.digest[:12]}.json"


def _pair(key: str) -> ResultKey | None:
    """The pair a latest-result key names (``provider/model.json``), or ``None`` for any other key."""
    parts = key.split("/")
    if len(parts) != 2 or not parts[1].endswith(".json") or not parts[0]:
        return None
    return urllib.parse.unquote(parts[0]), urllib.parse.unquote(parts[1].removesuffix(".json"))


def _checked(where: str, raw: bytes, pair: ResultKey) -> ConformanceResult:
    try:
        result = parse_result(raw)
    except InvalidResult as exc:
        raise ConformanceStoreError(f"{where}: {exc}") from None
    if (result.deployment, result.model) != pair:
        raise ConformanceStoreError(f"{where}: the result is of another deployment or model")
    return result


class ResultStore(Protocol):
    @property
    def location(self) -> str: ...

    def write(self, result: ConformanceResult) -> str:
        """Store ``result`` as its pair's latest, and in the history; the latest's full key."""
        ...

    def read(self, deployment: str, model: str) -> ConformanceResult | None: ...

    def read_all(self) -> dict[ResultKey, ConformanceResult]:
        """Every pair's latest result; :class:`ConformanceStoreError` if one does not verify."""
        ...


@dataclass(frozen=True, slots=True)
class DirectoryStore:
    root: Path

    @property
    def location(self) -> str:
        return str(self.root)

    def write(self, result: ConformanceResult) -> str:
        body = result.to_json()
        latest = self.root / latest_key(result.deployment, result.model)
        try:
            for key in (history_key(result), latest_key(result.deployment, result.model)):
                path = self.root / key
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_bytes(body)
                tmp.replace(path)
        except OSError as exc:
            raise ConformanceStoreError(f"{self.root}: cannot write ({exc.strerror or type(exc).__name__})") from None
        return str(latest)

    def read(self, deployment: str, model: str) -> ConformanceResult | None:
        path = self.root / latest_key(deployment, model)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConformanceStoreError(f"{path}: cannot read ({exc.strerror or type(exc).__name__})") from None
        return _checked(str(path), raw, (deployment, model))

    def read_all(self) -> dict[ResultKey, ConformanceResult]:
        if not self.root.exists():
            return {}
        if not self.root.is_dir():
            raise ConformanceStoreError(f"{self.root}: not a directory")
        out: dict[ResultKey, ConformanceResult] = {}
        for path in sorted(self.root.glob("*/*.json")):
            pair = _pair(path.relative_to(self.root).as_posix())
            if pair is None:
                continue
            try:
                raw = path.read_bytes()
            except OSError as exc:
                raise ConformanceStoreError(f"{path}: cannot read ({exc.strerror or type(exc).__name__})") from None
            out[pair] = _checked(str(path), raw, pair)
        return out


class S3Store:
    """Results under ``s3://bucket/prefix/``; ``client`` is a botocore S3 client (default:
    ``tollway.aws``'s, built on first use)."""

    def __init__(self, bucket: str, prefix: str, client: Any | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._client = client

    @property
    def location(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    @property
    def client(self) -> Any:
        if self._client is None:
            from tollway import aws

            self._client = aws.client("s3")
        return self._client

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def write(self, result: ConformanceResult) -> str:
        body = result.to_json()
        latest = self._key(latest_key(result.deployment, result.model))
        for key in (self._key(history_key(result)), latest):
            try:
                self.client.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/json")
            except Exception as exc:
                raise ConformanceStoreError(f"s3://{self.bucket}/{key}: cannot write ({aws_error_code(exc)})") from None
        return f"s3://{self.bucket}/{latest}"

    def _get(self, key: str) -> bytes | None:
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
            if int(response.get("ContentLength", 0)) > MAX_RESULT_BYTES:
                raise ConformanceStoreError(f"s3://{self.bucket}/{key}: larger than {MAX_RESULT_BYTES} bytes")
            return bytes(response["Body"].read())
        except ConformanceStoreError:
            raise
        except Exception as exc:
            code = aws_error_code(exc)
            if code in ("NoSuchKey", "404"):
                return None
            raise ConformanceStoreError(f"s3://{self.bucket}/{key}: cannot read ({code})") from None

    def read(self, deployment: str, model: str) -> ConformanceResult | None:
        key = self._key(latest_key(deployment, model))
        raw = self._get(key)
        return None if raw is None else _checked(f"s3://{self.bucket}/{key}", raw, (deployment, model))

    def read_all(self) -> dict[ResultKey, ConformanceResult]:
        start = f"{self.prefix}/" if self.prefix else ""
        out: dict[ResultKey, ConformanceResult] = {}
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start)
            keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
        except Exception as exc:
            raise ConformanceStoreError(f"{self.location}: cannot list ({aws_error_code(exc)})") from None
        for key in sorted(keys):
            pair = _pair(key[len(start) :])
            if pair is None:
                continue
            raw = self._get(key)
            if raw is not None:
                out[pair] = _checked(f"s3://{self.bucket}/{key}", raw, pair)
        return out


def open_store(location: str, base: Path | None = None, *, s3_client: Any | None = None) -> ResultStore:
    """The store at ``location`` (``s3://bucket/prefix`` or a directory; a relative directory is
    taken from ``base``, the configuration file's folder, when given)."""
    if location.startswith("s3://"):
        bucket, _, prefix = location[len("s3://") :].partition("/")
        if not bucket:
            raise ConformanceStoreError(f"{location}: no bucket")
        return S3Store(bucket, prefix, s3_client)
    path = Path(location).expanduser()
    if base is not None and not path.is_absolute():
        path = base / path
    return DirectoryStore(path)


if TYPE_CHECKING:
    _directory_is_a_store: type[ResultStore] = DirectoryStore
    _s3_is_a_store: type[ResultStore] = S3Store
