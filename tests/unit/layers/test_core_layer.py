"""The core layer (``shared/tollway``) and the build's guards, built for real into temp dirs."""

from __future__ import annotations

import ast
import json
import tomllib
import zipfile
from pathlib import Path

import pytest

from layers.archive import MIB, LayerSizeError, Limits
from layers.build import CORE_EXCLUDED, ROOT, _requirement_name, build, core_files, project_requirements, read_lock

SOURCE = ROOT / "shared" / "tollway"


def names(zip_path: Path) -> list[str]:
    with zipfile.ZipFile(zip_path) as zf:
        return zf.namelist()


def test_core_layer_is_reproducible_and_holds_only_what_lambda_runs(tmp_path: Path) -> None:
    first = build(tmp_path / "a", ["core"])
    second = build(tmp_path / "b", ["core"])
    digest = first["layers"]["core"]["sha256"]
    assert digest == second["layers"]["core"]["sha256"]
    assert (tmp_path / "a" / "core.zip").read_bytes() == (tmp_path / "b" / "core.zip").read_bytes()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["core.zip", "manifest.json"]

    entries = names(tmp_path / "a" / "core.zip")
    assert "python/tollway/server/app.py" in entries
    assert "python/tollway/cli.py" in entries  # the streaming deployment's entrypoint (run.sh)
    assert not [n for n in entries if "__pycache__" in n or n.endswith((".pyc", ".pyo"))]
    for excluded in CORE_EXCLUDED:
        assert not [n for n in entries if n.startswith(f"python/tollway/{excluded}/")]
    assert "mock" in CORE_EXCLUDED
    kept = {str(a) for a in core_files(SOURCE)}
    assert {n for n in entries if not n.endswith("/")} == kept

    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    core = manifest["layers"]["core"]
    assert core["sha256"] == digest and core["files"] == len(kept)
    assert core["zipped_bytes"] == (tmp_path / "a" / "core.zip").stat().st_size
    with zipfile.ZipFile(tmp_path / "a" / "core.zip") as zf:
        assert core["unzipped_bytes"] == sum(i.file_size for i in zf.infolist())
    assert core["packages"] == {"tollway": tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]}


def test_core_files_skip_bytecode_and_excluded_packages(tmp_path: Path) -> None:
    src = tmp_path / "tollway"
    for rel in (
        "__init__.py",
        "server/app.py",
        "server/__pycache__/app.cpython-311.pyc",
        "stray.pyc",
        "mock/app.py",
        "cloud/local.py",
        "examples/llm-router.yml",
        "mockery.py",
    ):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text("")
    assert sorted(core_files(src)) == [
        "python/tollway/__init__.py",
        "python/tollway/examples/llm-router.yml",
        "python/tollway/mockery.py",
        "python/tollway/server/app.py",
    ]


def test_source_date_epoch_sets_the_entries_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    manifest = build(tmp_path, ["core"])
    assert manifest["layers"]["core"]["zip_timestamp"] == "2023-11-14T22:13:20Z"
    with zipfile.ZipFile(tmp_path / "core.zip") as zf:
        assert {i.date_time for i in zf.infolist()} == {(2023, 11, 14, 22, 13, 20)}


def test_an_oversized_layer_fails_the_build_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(LayerSizeError, match=r"core: core\.zip is .* MiB zipped"):
        build(tmp_path, ["core"], limits=Limits(zip_bytes=1024))
    with pytest.raises(LayerSizeError, match="unzipped"):
        build(tmp_path, ["core"], limits=Limits(unzipped_total_bytes=2 * MIB, reserved_bytes=2 * MIB - 1024))
    assert list(tmp_path.iterdir()) == []


def _imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_nothing_lambda_runs_imports_what_the_core_layer_leaves_out() -> None:
    """Dropping a subpackage is safe only while no shipped module, nor any function, imports it."""
    dropped = tuple(f"tollway.{name}" for name in CORE_EXCLUDED)
    sources = [p for p in core_files(SOURCE).values() if p.suffix == ".py"]
    sources += sorted((ROOT / "functions").rglob("*.py"))
    offenders = sorted(
        f"{p.relative_to(ROOT)}: {m}"
        for p in sources
        for m in _imported_modules(p)
        if m in dropped or m.startswith(tuple(d + "." for d in dropped))
    )
    assert offenders == []
    assert len(sources) > 20


def test_requirements_come_from_pyproject_less_what_the_runtime_provides() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    requirements = project_requirements(ROOT / "pyproject.toml")
    assert [r for r in declared if r not in requirements] == [r for r in declared if r.startswith("boto3")]
    assert {"starlette", "mangum"} <= {r.split("==")[0] for r in requirements}
    lock = read_lock(ROOT / "constraints.txt")
    assert all(_requirement_name(r) in lock for r in requirements)
    assert "crc32c" in lock  # kafka-python[crc32c]'s extra is pinned too
