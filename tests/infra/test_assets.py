"""Code staging and layer lookup: what goes into the function zip, and how a missing layer fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.app import AppContext, build_stack, new_app
from infra.assets import CONFIG_NAME, DEFAULT_CONFIG, REPO_ROOT, MissingAssetError, layer_zips, stage_function_code
from tests.infra.synth import Synth, function


def tree(root: Path) -> dict[str, tuple[int, bytes]]:
    return {
        p.relative_to(root).as_posix(): (p.stat().st_mode & 0o777, p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    write(root / "functions/__init__.py", '"""functions"""\n')
    write(root / "functions/gateway/__init__.py", "")
    write(root / "functions/gateway/handler.py", "handler = None\n", 0o600)
    write(root / "functions/gateway/run.sh", "#!/bin/sh\n", 0o700)
    write(root / "functions/gateway/sub/helper.py", "x = 1\n")
    write(root / "functions/gateway/__pycache__/handler.cpython-311.pyc", "bytecode")
    write(root / "functions/gateway/stale.pyc", "bytecode")
    write(root / "functions/other/handler.py", "other = None\n")
    write(root / "config.yml", "models: []\n")
    return root


def test_staging_holds_the_package_marker_the_function_and_the_config_only(repo: Path, tmp_path: Path) -> None:
    staged = stage_function_code(tmp_path / "out", "functions/gateway", repo_root=repo, config=repo / "config.yml")
    assert tree(staged) == {
        "functions/__init__.py": (0o644, b'"""functions"""\n'),
        "functions/gateway/__init__.py": (0o644, b""),
        "functions/gateway/handler.py": (0o644, b"handler = None\n"),
        "functions/gateway/run.sh": (0o755, b"#!/bin/sh\n"),
        "functions/gateway/sub/helper.py": (0o644, b"x = 1\n"),
        CONFIG_NAME: (0o644, b"models: []\n"),
    }


def test_staging_is_deterministic_and_replaces_what_was_there(repo: Path, tmp_path: Path) -> None:
    first = stage_function_code(tmp_path / "a", "functions/gateway", repo_root=repo)
    write(tmp_path / "b" / "leftover.txt", "old")
    second = stage_function_code(tmp_path / "b", "functions/gateway", repo_root=repo)
    assert tree(first) == tree(second)
    assert CONFIG_NAME not in tree(first)


def test_staging_refuses_a_folder_outside_functions(repo: Path, tmp_path: Path) -> None:
    write(repo / "elsewhere/handler.py", "")
    with pytest.raises(ValueError, match="under functions/"):
        stage_function_code(tmp_path / "out", "elsewhere", repo_root=repo)
    with pytest.raises(MissingAssetError, match="function source folder not found"):
        stage_function_code(tmp_path / "out", "functions/missing", repo_root=repo)
    with pytest.raises(MissingAssetError, match="config file not found"):
        stage_function_code(tmp_path / "out", "functions/gateway", repo_root=repo, config=repo / "nope.yml")


def test_the_real_gateway_stages_with_an_executable_run_sh_and_the_config(tmp_path: Path) -> None:
    config = REPO_ROOT / DEFAULT_CONFIG
    staged = stage_function_code(tmp_path / "gw", "functions/gateway", config=config)
    files = tree(staged)
    assert files["functions/gateway/run.sh"][0] == 0o755
    assert {"functions/__init__.py", "functions/gateway/handler.py", "functions/gateway/app.py"} <= set(files)
    assert files[CONFIG_NAME][1] == config.read_bytes()
    assert not [p for p in files if "__pycache__" in p or p.endswith(".pyc")]
    assert os.access(staged / "functions/gateway/run.sh", os.X_OK)


def test_the_code_asset_hash_does_not_depend_on_where_it_was_staged(synth: Synth, worker_synth: Synth) -> None:
    """Two syntheses staged in different temporary folders: same code and config, same asset key."""
    _, one = function(synth, synth.topology.gateway.name)
    _, two = function(worker_synth, worker_synth.topology.gateway.name)
    assert one["Code"]["S3Key"] == two["Code"]["S3Key"]


def test_a_missing_layer_zip_names_the_build_command(tmp_path: Path) -> None:
    (tmp_path / "deps.zip").write_bytes(b"PK")
    with pytest.raises(MissingAssetError) as raised:
        layer_zips(tmp_path)
    message = str(raised.value)
    assert "core.zip" in message and "extension.zip" in message and "deps.zip" not in message
    assert f"python -m layers.build --out {tmp_path}" in message


def test_synth_fails_before_building_anything_when_the_layers_are_missing(tmp_path: Path) -> None:
    app = new_app({"layersDir": str(tmp_path / "empty")})
    with pytest.raises(MissingAssetError, match=r"python -m layers\.build"):
        build_stack(app, AppContext.from_app(app), tmp_path / "staging")
    assert app.node.children == []


def test_the_app_reports_a_missing_layer_in_one_line(tmp_path: Path) -> None:
    """What ``cdk synth`` shows when the layers were not built: the fix, not a traceback."""
    env = {**os.environ, "CDK_CONTEXT_JSON": json.dumps({"layersDir": str(tmp_path)}), "CDK_OUTDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "infra.app"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert result.stderr.endswith(
        f"error: layer zip not found: {tmp_path}/deps.zip, {tmp_path}/core.zip, {tmp_path}/extension.zip; "
        f"build the layers first: python -m layers.build --out {tmp_path}\n"
    )
    assert "Traceback" not in result.stderr
