"""The reproducible zip writer, the machine-path scan and the size guard, on small made-up trees."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest

from layers.archive import (
    MIB,
    BuildError,
    LayerSizeError,
    LayerZip,
    Limits,
    check_sizes,
    find_machine_paths,
    write_zip,
    zip_date_time,
)

EPOCH_1980 = (1980, 1, 1, 0, 0, 0)


def make_tree(root: Path, files: dict[str, bytes], mode: int, mtime: int) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)
        os.utime(path, (mtime, mtime))
        out[f"python/{rel}"] = path
    return out


FILES = {"pkg/__init__.py": b"", "pkg/mod.py": b"x = 1\n", "pkg/sub/data.json": b"{}", "top.py": b"import pkg\n"}


def test_same_files_give_the_same_bytes_whatever_their_mtime_mode_and_order(tmp_path: Path) -> None:
    a = make_tree(tmp_path / "a", FILES, 0o600, 1_000_000_000)
    b = make_tree(tmp_path / "b", FILES, 0o664, 1_700_000_000)
    za = write_zip("t", a, tmp_path / "a.zip", EPOCH_1980)
    zb = write_zip("t", dict(reversed(list(b.items()))), tmp_path / "b.zip", EPOCH_1980)
    assert za.sha256 == zb.sha256 == hashlib.sha256((tmp_path / "a.zip").read_bytes()).hexdigest()
    assert za.content_sha256 == zb.content_sha256
    assert (za.files, za.unzipped_bytes) == (4, sum(len(d) for d in FILES.values()))
    assert za.zipped_bytes == (tmp_path / "a.zip").stat().st_size


def test_entries_are_sorted_with_fixed_time_and_permissions(tmp_path: Path) -> None:
    files = make_tree(tmp_path / "src", FILES, 0o600, 1_600_000_000)
    (tmp_path / "src" / "pkg" / "mod.py").chmod(0o700)
    write_zip("t", files, tmp_path / "t.zip", (2020, 5, 17, 10, 30, 42))
    with zipfile.ZipFile(tmp_path / "t.zip") as zf:
        infos = zf.infolist()
    names = [i.filename for i in infos]
    assert names == sorted(names)
    assert names[:3] == ["python/", "python/pkg/", "python/pkg/__init__.py"]
    assert {i.date_time for i in infos} == {(2020, 5, 17, 10, 30, 42)}
    modes = {i.filename: i.external_attr >> 16 for i in infos}
    assert modes["python/pkg/"] == 0o40755
    assert modes["python/pkg/mod.py"] == 0o100755
    assert modes["python/top.py"] == modes["python/pkg/sub/data.json"] == 0o100644


def test_the_executable_bit_changes_the_digest(tmp_path: Path) -> None:
    files = make_tree(tmp_path / "src", FILES, 0o644, 0)
    before = write_zip("t", files, tmp_path / "a.zip", EPOCH_1980)
    (tmp_path / "src" / "top.py").chmod(0o755)
    after = write_zip("t", files, tmp_path / "b.zip", EPOCH_1980)
    assert before.sha256 != after.sha256
    assert before.content_sha256 != after.content_sha256


def test_unsafe_archive_names_are_refused(tmp_path: Path) -> None:
    src = tmp_path / "f"
    src.write_bytes(b"")
    for bad in ("/abs/f", "python/../f", "python\\f"):
        with pytest.raises(BuildError, match="invalid archive names"):
            write_zip("t", {bad: src}, tmp_path / "t.zip", EPOCH_1980)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, EPOCH_1980),
        ("", EPOCH_1980),
        ("1700000000", (2023, 11, 14, 22, 13, 20)),
        ("0", EPOCH_1980),
        ("9999999999", (2107, 12, 31, 23, 59, 58)),
    ],
)
def test_timestamp_follows_source_date_epoch_within_what_zip_can_hold(
    value: str | None, expected: tuple[int, ...]
) -> None:
    assert zip_date_time(value) == expected


def test_a_malformed_source_date_epoch_is_an_error() -> None:
    with pytest.raises(BuildError, match="SOURCE_DATE_EPOCH"):
        zip_date_time("yesterday")


def test_machine_paths_are_found_in_names_and_contents(tmp_path: Path) -> None:
    here = str(tmp_path)
    files = make_tree(tmp_path / "src", {"a.py": f"ROOT = '{here}/x'\n".encode(), "b.py": b"ok = 1\n"}, 0o644, 0)
    write_zip("t", files, tmp_path / "t.zip", EPOCH_1980)
    hits = find_machine_paths(tmp_path / "t.zip", [here, "/"])
    assert hits == [f"python/a.py ({here})"]
    assert find_machine_paths(tmp_path / "t.zip", ["/nowhere/at/all"]) == []


def layer(name: str, zipped: int, unzipped: int) -> LayerZip:
    return LayerZip(name, Path(f"{name}.zip"), "0" * 64, "0" * 64, zipped, unzipped, 1)


def test_size_guard_fails_on_a_zip_over_the_upload_limit() -> None:
    limits = Limits(zip_bytes=1000)
    check_sizes([layer("core", 1000, 5000)], limits)
    with pytest.raises(LayerSizeError) as info:
        check_sizes([layer("core", 1000, 5000), layer("deps", 1001, 5000)], limits)
    message = str(info.value)
    assert "deps: deps.zip" in message and "direct-upload limit" in message
    assert "core" not in message


def test_size_guard_fails_when_the_layers_together_leave_no_room_for_the_function() -> None:
    limits = Limits(zip_bytes=10 * MIB, unzipped_total_bytes=10_000, reserved_bytes=4_000)
    assert limits.layers_unzipped_bytes == 6_000
    check_sizes([layer("core", 10, 1_000), layer("deps", 10, 5_000)], limits)
    with pytest.raises(LayerSizeError, match=r"at most 0\.0 MiB") as info:
        check_sizes([layer("core", 10, 1_001), layer("deps", 10, 5_000)], limits)
    assert "unzipped" in str(info.value)


def test_default_limits_are_lambdas() -> None:
    limits = Limits()
    assert limits.zip_bytes == 52_428_800
    assert limits.unzipped_total_bytes == 262_144_000
    assert 0 < limits.reserved_bytes < limits.unzipped_total_bytes
