"""The real ``cdk synth`` (the npm CLI in ``infra/node_modules``) runs the app offline from ``infra/``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra.assets import CONFIG_NAME
from tests.infra.synthetic import placeholder_layers
from tests.infra.template_tools import wildcard_statements
from tollway.cloud.resources import topology

pytestmark = pytest.mark.slow

INFRA = Path(__file__).resolve().parents[2] / "infra"
STAGE = "cli-stage"


def test_cdk_synth_cli_builds_the_stack_offline(tmp_path: Path) -> None:
    cdk = INFRA / "node_modules" / ".bin" / "cdk"
    assert shutil.which("node"), "Node.js is required for the CDK CLI"
    assert cdk.exists(), "run `npm ci` in infra/ (make test does)"
    out = tmp_path / "cdk.out"
    layers = placeholder_layers(tmp_path / "layers")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        "TOLLWAY_PYTHON": sys.executable,
        "CDK_DISABLE_VERSION_CHECK": "1",
    }
    args = [str(cdk), "synth", "--quiet", "--output", str(out), "-c", f"stage={STAGE}", "-c", f"layersDir={layers}"]
    result = subprocess.run(args, cwd=INFRA, env=env, capture_output=True, text=True, timeout=110, check=False)
    assert result.returncode == 0, result.stdout + result.stderr

    manifest = json.loads((out / "manifest.json").read_text())
    stacks = [k for k, a in manifest["artifacts"].items() if a["type"] == "aws:cloudformation:stack"]
    assert stacks == [STAGE]
    template = json.loads((out / f"{STAGE}.template.json").read_text())
    resources = template["Resources"].values()
    names = {r["Properties"].get("FunctionName") for r in resources if r["Type"] == "AWS::Lambda::Function"}
    topo = topology(STAGE)
    assert names == {topo.gateway.name, f"{topo.gateway.name}-buffered", *(f.name for f in topo.functions)}
    modes = sorted(r["Properties"]["InvokeMode"] for r in resources if r["Type"] == "AWS::Lambda::Url")
    assert modes == ["BUFFERED", "RESPONSE_STREAM"]
    assert wildcard_statements(template) == []

    (gateway_fn,) = [r for r in resources if r["Properties"].get("FunctionName") == topo.gateway.name]
    code_dir = out / f"asset.{gateway_fn['Properties']['Code']['S3Key'].removesuffix('.zip')}"
    run_sh = code_dir / "functions" / "gateway" / "run.sh"
    assert os.access(run_sh, os.X_OK), "the adapter executes run.sh: the asset must keep its mode"
    assert (code_dir / CONFIG_NAME).is_file()
    assert not list(code_dir.rglob("__pycache__"))
