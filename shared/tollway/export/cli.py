"""What ``tollway export ...`` does, as plain functions the main CLI calls and renders.

- :func:`create` puts the request on the export queue, then polls the exports bucket and yields
  :class:`ExportStatus` events (``queued``, ``progress`` as shards appear, then ``done`` with the
  verified manifest, or ``timeout``).
- :func:`list_exports` lists the exports in the bucket, with their manifests' summaries.
- :func:`show` reads a manifest and checks it against its own digest.
- :func:`download` copies a verified manifest and its shards into a directory, checking every
  shard's size and SHA-256 against the manifest before it is kept.

No function here prints or reads the environment: the caller builds the sink and the queue
(``S3ExportSink.from_env()``, ``SqsExportQueue.from_env()``) and renders the results.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import orjson

from tollway.export.errors import ExportError, ExportIntegrityError
from tollway.export.manifest import EXPORTS_ROOT, export_prefix, manifest_key, status_key, verify_manifest
from tollway.export.queue import ExportQueue
from tollway.export.request import ExportRequest, encode_message
from tollway.export.sink import ExportSink

__all__ = ["ExportStatus", "create", "download", "list_exports", "show"]


@dataclass(frozen=True, slots=True)
class ExportStatus:
    export_id: str
    state: Literal["queued", "progress", "done", "timeout"]
    shards: int = 0
    """Shard objects stored so far (``done``: the manifest's count)."""
    manifest: dict[str, Any] | None = field(default=None, repr=False)
    """The verified manifest (``done`` only)."""
    message_id: str | None = None
    counts: dict[str, Any] | None = None
    """``progress``: the run's status object (records scanned, matched, included, excluded; the
    phase), once the function has written one."""


def create(
    request: ExportRequest,
    queue: ExportQueue,
    sink: ExportSink,
    *,
    timeout_s: float = 900.0,
    poll_interval_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[ExportStatus]:
    """Enqueue ``request`` and follow it until its manifest is stored (or ``timeout_s`` passes).

    ``timeout`` ends the wait, not the export: the function carries on, and ``show`` tells later.
    """
    export_id = request.export_id
    message_id = queue.send(encode_message(request))
    yield ExportStatus(export_id, "queued", message_id=message_id)
    deadline = clock() + timeout_s
    shards_prefix = f"{export_prefix(export_id)}shards/"
    seen: object = None
    while True:
        raw = sink.get(manifest_key(export_id))
        if raw is not None:
            manifest = verify_manifest(raw)
            yield ExportStatus(export_id, "done", len(manifest["shards"]), manifest, message_id)
            return
        count = len(sink.list(shards_prefix))
        status = _status(sink, export_id)
        state = (count, status)
        if state != seen:
            seen = state
            yield ExportStatus(export_id, "progress", count, message_id=message_id, counts=status)
        if clock() >= deadline:
            yield ExportStatus(export_id, "timeout", count, message_id=message_id)
            return
        sleep(poll_interval_s)


def _status(sink: ExportSink, export_id: str) -> dict[str, Any] | None:
    raw = sink.get(status_key(export_id))
    if raw is None:
        return None
    try:
        found = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return found if isinstance(found, dict) else None


def list_exports(sink: ExportSink) -> list[dict[str, Any]]:
    """One summary per export in the bucket, by export id: ``exportId``, ``complete`` (a manifest
    is stored), ``shards`` (objects stored), and from the manifest ``purpose``, ``records``,
    ``digest`` and ``requestedBy``. A manifest that fails its digest shows ``"valid": False``."""
    found: dict[str, dict[str, Any]] = {}
    for key in sink.list(f"{EXPORTS_ROOT}/"):
        parts = PurePosixPath(key).parts
        if len(parts) < 3:
            continue
        entry = found.setdefault(parts[1], {"exportId": parts[1], "complete": False, "shards": 0})
        if parts[2:] == ("manifest.json",):
            entry["complete"] = True
        elif parts[2] == "shards":
            entry["shards"] += 1
    for entry in found.values():
        if entry["complete"]:
            try:
                manifest = show(sink, entry["exportId"])
            except ExportIntegrityError:
                entry["valid"] = False
                continue
            entry |= {
                "valid": True,
                "purpose": manifest["purpose"],
                "records": manifest["records"],
                "digest": manifest["digest"],
                "requestedBy": manifest["requestedBy"],
            }
    return [found[k] for k in sorted(found)]


def show(sink: ExportSink, export_id: str) -> dict[str, Any]:
    """The export's manifest, verified against its digest. Raises :class:`ExportError` when there
    is none, :class:`ExportIntegrityError` when it does not verify."""
    return _manifest(sink, export_id)[1]


def _manifest(sink: ExportSink, export_id: str) -> tuple[bytes, dict[str, Any]]:
    raw = sink.get(manifest_key(export_id))
    if raw is None:
        raise ExportError(f"export {export_id} has no manifest (unknown, or still running)")
    manifest = verify_manifest(raw)
    if manifest.get("exportId") != export_id:
        raise ExportIntegrityError(f"the manifest stored for export {export_id} names another export")
    return raw, manifest


def download(sink: ExportSink, export_id: str, directory: Path) -> list[Path]:
    """Copy the export's verified manifest and shards into ``directory``; the paths written.

    A shard is written under a temporary name and renamed only once its size and SHA-256 match
    the manifest, so a file in ``directory`` is always a verified one.
    """
    raw, manifest = _manifest(sink, export_id)
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for shard in manifest["shards"]:
        key = str(shard["key"])
        body = sink.get(key)
        if body is None:
            raise ExportIntegrityError(f"export {export_id}: shard {key} is missing")
        if len(body) != shard["bytes"] or hashlib.sha256(body).hexdigest() != shard["sha256"]:
            raise ExportIntegrityError(f"export {export_id}: shard {key} does not match its digest")
        written.append(_write(directory / PurePosixPath(key).name, body))
    written.append(_write(directory / "manifest.json", raw))
    return written


def _write(path: Path, body: bytes) -> Path:
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(body)
    os.replace(partial, path)
    return path
