"""The dependencies layer, built with the real pip from the wheel cache, and both layers run together.

The first build on a machine downloads the wheels into ``layers/.cache`` (from the package
registry); every later build installs from that cache offline, in a few seconds.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from layers.build import ROOT, TARGET, build, read_lock

pytestmark = pytest.mark.slow

REQUIRED = ("starlette", "uvicorn", "orjson", "aiohttp", "pydantic_core", "mangum", "uvloop", "httptools", "yaml")
"""Import packages of the gateway's runtime dependencies (FastAPI left the project for bare Starlette)."""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    out = tmp_path_factory.mktemp("layers")
    manifest = build(out)
    yield out, manifest


def read_zip(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {n: zf.read(n) for n in zf.namelist() if not n.endswith("/")}


def test_deps_layer_holds_the_runtime_dependencies_for_lambdas_platform(built: tuple[Path, dict[str, Any]]) -> None:
    out, _ = built
    files = read_zip(out / "deps.zip")
    top = {n.split("/")[1] for n in files}
    for package in REQUIRED:
        assert package in top, package
        assert f"python/{package}/__init__.py" in files, package
    orjson_so = [n for n in files if n.startswith("python/orjson/") and n.endswith(".so")]
    abi = TARGET["python-version"].replace(".", "")
    assert orjson_so == [f"python/orjson/orjson.cpython-{abi}-x86_64-linux-gnu.so"]
    assert files[orjson_so[0]][:4] == b"\x7fELF"
    assert "boto3" not in top and "botocore" not in top  # the runtime provides them

    assert not [n for n in files if n.rsplit("/", 1)[-1] in ("direct_url.json", "INSTALLER", "REQUESTED")]
    assert not [n for n in files if "__pycache__" in n or n.endswith(".pyc")]
    assert not [n for n in files if n.startswith("python/bin/")]
    here = [str(ROOT).encode(), sys.prefix.encode(), str(out).encode()]
    assert not [n for n, data in files.items() if any(p in data or p in n.encode() for p in here)]


def test_every_record_row_names_a_shipped_file_with_its_hash(built: tuple[Path, dict[str, Any]]) -> None:
    out, _ = built
    files = read_zip(out / "deps.zip")
    records = [n for n in files if n.endswith(".dist-info/RECORD")]
    assert len(records) >= len(REQUIRED)
    for record in records:
        rows = list(csv.reader(io.StringIO(files[record].decode())))
        assert rows == sorted(rows)
        for path, digest, size in rows:
            data = files[f"python/{path}"]
            if f"python/{path}" == record:
                assert (digest, size) == ("", "")
                continue
            expected = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, size) == (expected, str(len(data))), path


def test_manifest_pins_match_the_lock_and_the_zips(built: tuple[Path, dict[str, Any]]) -> None:
    out, manifest = built
    assert manifest == json.loads((out / "manifest.json").read_text())
    deps = manifest["layers"]["deps"]
    lock = read_lock(ROOT / "constraints.txt")
    for name, version in deps["packages"].items():
        assert lock[re.sub(r"[-_.]+", "-", name).lower()] == version, name
    assert {"starlette", "pydantic_core", "mangum"} <= set(deps["packages"])
    assert deps["sha256"] == hashlib.sha256((out / "deps.zip").read_bytes()).hexdigest()
    assert deps["files"] == len(read_zip(out / "deps.zip"))
    total = sum(layer["unzipped_bytes"] for layer in manifest["layers"].values())
    assert manifest["unzipped_total_bytes"] == total < manifest["limits"]["unzipped_total_bytes"]
    assert deps["zipped_bytes"] < manifest["limits"]["zip_bytes"]


def test_deps_layer_is_reproducible(built: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    out, manifest = built
    again = build(tmp_path, ["deps"])
    assert again["layers"]["deps"]["sha256"] == manifest["layers"]["deps"]["sha256"]
    assert (tmp_path / "deps.zip").read_bytes() == (out / "deps.zip").read_bytes()


def test_rebuilding_one_layer_keeps_the_others_entry_while_its_zip_is_unchanged(
    built: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    out, manifest = built
    for name in ("deps.zip", "manifest.json"):
        shutil.copy(out / name, tmp_path / name)
    again = build(tmp_path, ["core"])
    assert again["layers"]["deps"] == manifest["layers"]["deps"]
    assert again["unzipped_total_bytes"] == sum(layer["unzipped_bytes"] for layer in again["layers"].values())
    assert again["unzipped_total_bytes"] > manifest["layers"]["deps"]["unzipped_bytes"]

    with (tmp_path / "deps.zip").open("ab") as f:
        f.write(b"\0")
    assert sorted(build(tmp_path, ["core"])["layers"]) == ["core"]


def test_a_layer_built_for_another_python_is_not_kept(built: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    out, manifest = built
    shutil.copy(out / "deps.zip", tmp_path / "deps.zip")
    older = {**manifest, "target": {**manifest["target"], "python-version": "3.11"}}
    (tmp_path / "manifest.json").write_text(json.dumps(older))
    assert sorted(build(tmp_path, ["core"])["layers"]) == ["core"]


PROBE = """
import importlib.util, json, sys
layer, config = sys.argv[1], sys.argv[2]
sys.path.insert(0, layer)
import mangum
import tollway.cli
import tollway.server.app
import httptools, uvicorn, uvloop, yaml
handler = mangum.Mangum(tollway.server.app.create_app(config, watch_interval_s=None), lifespan="off")
host = "abc.lambda-url.us-east-1.on.aws"
event = {
    "version": "2.0", "routeKey": "$default", "rawPath": "/healthz", "rawQueryString": "", "isBase64Encoded": False,
    "headers": {"host": host},
    "requestContext": {"domainName": host, "requestId": "probe", "routeKey": "$default", "stage": "$default",
                       "http": {"method": "GET", "path": "/healthz", "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1"}},
}
response = handler(event, None)
modules = [m for m in sys.modules.values() if getattr(m, "__file__", None)]
print(json.dumps({
    "response": response,
    "path": sys.path,
    "from_layer": sorted({m.__name__.split(".")[0] for m in modules if m.__file__.startswith(layer)}),
    "boto3": importlib.util.find_spec("boto3") is not None,
}))
"""


MANGUM_LOOP_WARNING = "ignore:There is no current event loop:DeprecationWarning:mangum.adapter"
"""The one warning pyproject.toml's filterwarnings lets through on the layer's path (Python 3.12+)."""


def runtime_python() -> str:
    """An interpreter of the Lambda runtime's version: the layer's extension modules load in no other.

    This one when its version matches (``make test-newest`` on Python 3.13), otherwise the one
    ``.ci/find-python`` finds, as ``make`` does. The probe runs it with ``-I -S``, so none of its
    site-packages is seen, as on Lambda.
    """
    version = TARGET["python-version"]
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    found = subprocess.run(
        [str(ROOT / ".ci" / "find-python"), f"python{version}"], capture_output=True, text=True, check=False
    )
    if found.returncode != 0:
        pytest.skip(f"no python{version} here to run the layers for Lambda's python{version} runtime")
    return found.stdout.strip()


def test_the_two_layers_alone_run_the_gateway(built: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    out, _ = built
    python = runtime_python()
    opt = tmp_path / "opt"
    for name in ("deps", "core"):
        with zipfile.ZipFile(out / f"{name}.zip") as zf:
            zf.extractall(opt)
    config = tmp_path / "llm-router.yml"
    provider = {
        "type": "openai",
        "baseUrl": "http://127.0.0.1:9/v1",
        "providerAccountId": "acct",
        "quotaGroupId": "group",
        "credentials": [{"id": "c", "secretRef": "env:TOLLWAY_LAYER_PROVIDER_KEY"}],
    }
    route = {"id": "r", "provider": "p", "model": "x", "providerFormat": "openai-chat-completions"}
    config.write_text(json.dumps({"providers": {"p": provider}, "models": [{"name": "m-v1", "routes": [route]}]}))
    env = {"PATH": os.environ.get("PATH", ""), "TOLLWAY_LAYER_PROVIDER_KEY": "sk-test"}
    layer = str(opt / "python")
    proc = subprocess.run(
        [python, "-I", "-S", "-W", "error", "-W", MANGUM_LOOP_WARNING, "-c", PROBE, layer, str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["path"][0] == layer
    assert not [p for p in result["path"][1:] if "site-packages" in p or p.startswith(str(ROOT))]
    for package in ("tollway", "mangum", "starlette", "orjson", "pydantic_core", "uvloop", "httptools", "yaml"):
        assert package in result["from_layer"], package
    assert result["boto3"] is False
    assert result["response"]["statusCode"] == 200
    assert json.loads(result["response"]["body"])["status"] == "ok"
