"""Deploy one stage to AWS or to a local cloud: build the layers, synth once, bootstrap, deploy.

    python -m infra.deploy --target aws|local [--stage NAME] [--config FILE] [--layers-dir DIR] [--no-build]

``--target aws`` runs ``cdk`` with the caller's own credentials and region. ``--target local``
runs ``cdklocal`` against ``$AWS_ENDPOINT_URL`` (default ``http://127.0.0.1:4566``: LocalStack
or the embedded moto server) with dummy credentials: the caller's AWS variables are never
handed to an emulator. The app is synthesized once into a cloud assembly, which ``bootstrap``
and ``deploy`` then both read, so the Python app runs one time, not three.

What a local cloud needs, and this script sets (docs/deploy.md explains each):

- ``AWS_ENDPOINT_URL`` and ``AWS_ENDPOINT_URL_S3``: cdklocal refuses the first without the
  second, and its own default (``localhost.localstack.cloud``) needs DNS;
- ``AWS_ENDPOINT_URL_S3_FOR_CLOUDFORMATION=http://localhost:<port>``: the CLI builds the
  template URL it hands CloudFormation from it, and moto reads the bucket from the path only
  when the URL says ``localhost``;
- ``LambdaAdapterLayerArn`` set to a stand-in layer published to the emulator: an emulator
  cannot fetch AWS's public adapter layer (moto's CloudFormation ignores function layers, so
  there the stand-in only takes the template's non-default branch).

moto's CloudFormation ignores a few properties (a table's TTL and point-in-time recovery, a
bucket's versioning, lifecycle and public access block), so after the deploy the script
converges the stage's queues, tables and buckets with the local cloud bootstrap, which reads
the same topology; where the emulator applied everything, it changes nothing.

moto cannot update a CDK stack in place (its change-set API differs from CloudFormation's, and
the CLI's update path fails or retries for minutes), so a second deploy of a stage to the same
moto server stops at once with a message (the check runs only when the endpoint is moto).

The script prints the commands it runs and the stack outputs, never the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal
from urllib.parse import urlsplit, urlunsplit

from infra.assets import DEFAULT_CONFIG, DEFAULT_LAYERS_DIR, REPO_ROOT, MissingAssetError, layer_zips
from tollway.cloud.local import LOCAL_CREDENTIALS, LOCAL_REGION, reachable
from tollway.cloud.resources import DEFAULT_PREFIX, topology

__all__ = ["DeployError", "Plan", "local_cdk_home", "local_environment", "main"]

INFRA_DIR: Final = Path(__file__).resolve().parent
DEFAULT_ENDPOINT: Final = "http://127.0.0.1:4566"
ADAPTER_PARAMETER: Final = "LambdaAdapterLayerArn"
_LOOPBACK: Final = frozenset({"127.0.0.1", "localhost", "::1"})

Target = Literal["aws", "local"]


class DeployError(RuntimeError):
    """A step failed; the message says which and what to do (and never holds a credential)."""


@dataclass(frozen=True, slots=True)
class Plan:
    target: Target
    stage: str
    config: Path
    layers_dir: Path
    outdir: Path
    build: bool
    assembly: Path | None
    parameters: tuple[tuple[str, str], ...]
    approve: bool

    @property
    def cli(self) -> Path:
        return INFRA_DIR / "node_modules" / ".bin" / ("cdklocal" if self.target == "local" else "cdk")


def local_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The environment of ``cdklocal``: ``base`` without any AWS variable, plus the local cloud's.

    Every ``AWS_*`` variable of the caller goes (credentials, profile, role, region), so nothing
    of a real account reaches the emulator; the endpoint (and an explicit S3 endpoint) and the
    region are read from ``base`` first.
    """
    endpoint = (base.get("AWS_ENDPOINT_URL") or DEFAULT_ENDPOINT).rstrip("/")
    s3_endpoint = (base.get("AWS_ENDPOINT_URL_S3") or endpoint).rstrip("/")
    region = base.get("AWS_REGION") or base.get("AWS_DEFAULT_REGION") or LOCAL_REGION
    env = {k: v for k, v in base.items() if not k.startswith("AWS_")}
    env.update(LOCAL_CREDENTIALS)
    env.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ENDPOINT_URL_S3=s3_endpoint,
        AWS_REGION=region,
        AWS_DEFAULT_REGION=region,
        AWS_ENVAR_ALLOWLIST="AWS_REGION,AWS_DEFAULT_REGION",
    )
    url = urlsplit(s3_endpoint)
    if url.hostname in _LOOPBACK:
        netloc = f"localhost:{url.port}" if url.port else "localhost"
        env["AWS_ENDPOINT_URL_S3_FOR_CLOUDFORMATION"] = urlunsplit((url.scheme, netloc, "", "", ""))
    return env


def local_cdk_home(root: Path, account: str) -> Path:
    """The CDK CLI's cache folder for an emulator's account. The CLI caches the account it found per
    access key, and every emulator takes the same dummy key, so a deploy to LocalStack (account
    000000000000) after one to moto (123456789012) looked for its bootstrap in moto's account. One
    folder per account keeps them apart; moto servers on other ports share one account, and one."""
    return root / ".tollway" / "cdk-home" / account


def _emulator_account(env: Mapping[str, str]) -> str:
    from tollway.cloud.bootstrap import Clients

    return Clients(env["AWS_ENDPOINT_URL"], env["AWS_REGION"], env).account()


def aws_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment minus endpoint overrides, so a deploy to AWS never lands in an emulator."""
    return {k: v for k, v in base.items() if not k.startswith("AWS_ENDPOINT_URL")}


def _run(args: Sequence[str], *, env: Mapping[str, str], cwd: Path, what: str) -> None:
    print(f"$ {' '.join(_shown(a) for a in args)}", flush=True)
    result = subprocess.run(list(args), env=dict(env), cwd=cwd, check=False)
    if result.returncode != 0:
        raise DeployError(f"{what} failed (exit code {result.returncode})")


def _shown(arg: str) -> str:
    """Paths under the repository print relative to it: shorter, and no home directory in logs."""
    try:
        return str(Path(arg).relative_to(REPO_ROOT)) if os.path.isabs(arg) else arg
    except ValueError:
        return arg


def _build_layers(plan: Plan, env: Mapping[str, str]) -> None:
    args = [sys.executable, "-m", "layers.build", "--out", str(plan.layers_dir)]
    _run(args, env=env, cwd=REPO_ROOT, what="the layer build")


def _synth(plan: Plan, env: Mapping[str, str]) -> Path:
    context = {"stage": plan.stage, "config": str(plan.config), "layersDir": str(plan.layers_dir)}
    args = [str(plan.cli), "synth", "--quiet", "--output", str(plan.outdir)]
    for key, value in context.items():
        args += ["--context", f"{key}={value}"]
    _run(args, env={**env, "TOLLWAY_PYTHON": sys.executable}, cwd=INFRA_DIR, what="cdk synth")
    return plan.outdir


def _emulator(args: Sequence[str], env: Mapping[str, str], what: str) -> str:
    """Run ``python -m infra.emulator ARGS`` with the local environment only; return its stdout."""
    command = [sys.executable, "-m", "infra.emulator", *args]
    result = subprocess.run(command, env=dict(env), cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise DeployError(f"{what} failed: {result.stderr.strip()[-2000:]}")
    return result.stdout


def is_moto(endpoint: str) -> bool:
    """True when ``endpoint`` is a moto server (it serves its dashboard at ``/moto-api/``)."""
    try:
        with urllib.request.urlopen(endpoint.rstrip("/") + "/moto-api/", timeout=2) as response:
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False


def _refuse_moto_update(env: Mapping[str, str], stacks: Sequence[str]) -> None:
    if not is_moto(env["AWS_ENDPOINT_URL"]):
        return
    existing = _emulator(["existing", *stacks], env, "listing the local stacks").split()
    if existing:
        raise DeployError(
            f"stack {', '.join(existing)} already exists on this moto server, and moto cannot update a CDK "
            "stack in place; restart the local cloud or deploy another --stage"
        )


def _adapter_placeholder(env: Mapping[str, str], stage: str) -> str:
    return _emulator(["adapter-placeholder", stage], env, "publishing the adapter placeholder layer").strip()


def _stack_names(assembly: Path) -> list[str]:
    manifest = json.loads((assembly / "manifest.json").read_text())
    return [
        str(artifact.get("displayName", name))
        for name, artifact in manifest.get("artifacts", {}).items()
        if artifact.get("type") == "aws:cloudformation:stack"
    ]


def _print_outputs(outputs_file: Path, plan: Plan, env: Mapping[str, str], assembly: Path) -> None:
    outputs: dict[str, dict[str, str]] = json.loads(outputs_file.read_text()) if outputs_file.is_file() else {}
    for stack, values in outputs.items():
        print(f"\nOutputs of {stack}:")
        for key, value in sorted(values.items()):
            print(f"  {key} = {value}")
    if not any(outputs.values()) and plan.target == "local":
        _print_local_resources(env, _stack_names(assembly))


def _print_local_resources(env: Mapping[str, str], stacks: Sequence[str]) -> None:
    """moto keeps no outputs for a stack made from a change set; list what it created instead."""
    print("\nThe local cloud reported no stack outputs.", flush=True)
    print(_emulator(["resources", *stacks], env, "listing the stack's resources"), end="", flush=True)


def deploy(plan: Plan, base_env: Mapping[str, str]) -> None:
    if not plan.cli.exists():
        raise DeployError(f"{plan.cli} not found; install the CDK CLI first: (cd infra && npm ci)")
    if plan.target == "local":
        env = local_environment(base_env)
        if not reachable(env["AWS_ENDPOINT_URL"]):
            raise DeployError(
                f"no local cloud answers at {env['AWS_ENDPOINT_URL']}; start one (`tollway up`, "
                "`python -m moto.server --host 127.0.0.1 --port 4566`, or LocalStack) or set AWS_ENDPOINT_URL"
            )
        account = _emulator_account(env)
        env["CDK_DEFAULT_ACCOUNT"], env["CDK_DEFAULT_REGION"] = account, env["AWS_REGION"]
        if not base_env.get("CDK_HOME"):
            env["CDK_HOME"] = str(local_cdk_home(REPO_ROOT, account))
        print(
            f"Target: local cloud at {env['AWS_ENDPOINT_URL']} (account {account}, dummy credentials;"
            f" CDK cache {env.get('CDK_HOME')})",
            flush=True,
        )
    else:
        env = aws_environment(base_env)
        print("Target: AWS, with the credentials and region of this shell", flush=True)
    if plan.target == "local":
        _refuse_moto_update(env, _stack_names(plan.assembly) if plan.assembly else [plan.stage])
    if plan.assembly is not None:
        assembly = plan.assembly
    else:
        if not plan.config.is_file():
            raise DeployError(f"config file not found: {plan.config}")
        if plan.build:
            _build_layers(plan, env)
        try:
            layer_zips(plan.layers_dir)
        except MissingAssetError as exc:
            raise DeployError(str(exc)) from None
        assembly = _synth(plan, env)
    parameters = dict(plan.parameters)
    if plan.target == "local" and ADAPTER_PARAMETER not in parameters:
        parameters[ADAPTER_PARAMETER] = _adapter_placeholder(env, plan.stage)
    app = ["--app", str(assembly)]
    _run([str(plan.cli), "bootstrap", *app], env=env, cwd=INFRA_DIR, what="cdk bootstrap")
    outputs_file = assembly / "deploy-outputs.json"
    outputs_file.unlink(missing_ok=True)
    args = [str(plan.cli), "deploy", *app, "--all", "--outputs-file", str(outputs_file)]
    if plan.target == "local" or plan.approve:
        args += ["--require-approval", "never"]
    for key, value in parameters.items():
        args += ["--parameters", f"{key}={value}"]
    _run(args, env=env, cwd=INFRA_DIR, what="cdk deploy")
    if plan.target == "local":
        print("\nApplying what the emulator's CloudFormation may skip (tollway.cloud.bootstrap):", flush=True)
        print(_emulator(["converge", plan.stage], env, "converging the stage's resources"), end="", flush=True)
    _print_outputs(outputs_file, plan, env, assembly)


def _parameter(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected Name=value, got {text!r}")
    return key, value


def _stage(text: str) -> str:
    try:
        return topology(text).prefix
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: Sequence[str] | None = None) -> Plan:
    parser = argparse.ArgumentParser(prog="python -m infra.deploy", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--target", choices=("aws", "local"), required=True)
    parser.add_argument(
        "--stage", type=_stage, default=DEFAULT_PREFIX, help="resource prefix and stack name (default: %(default)s)"
    )
    parser.add_argument("--config", type=Path, default=REPO_ROOT / DEFAULT_CONFIG, help="llm-router.yml to bundle")
    parser.add_argument(
        "--layers-dir", type=Path, default=REPO_ROOT / DEFAULT_LAYERS_DIR, help="deps.zip, core.zip and extension.zip"
    )
    parser.add_argument("--no-build", dest="build", action="store_false", help="use the layer zips already built")
    parser.add_argument("--outdir", type=Path, default=INFRA_DIR / "cdk.out", help="where the assembly is written")
    parser.add_argument(
        "--assembly", type=Path, help="deploy this already synthesized cloud assembly (no layer build, no synth)"
    )
    parser.add_argument(
        "--parameter",
        dest="parameters",
        type=_parameter,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a stack parameter (repeatable), e.g. GatewayMemorySize=2048",
    )
    parser.add_argument("--yes", action="store_true", help="AWS: deploy IAM changes without asking")
    ns = parser.parse_args(argv)
    return Plan(
        target=ns.target,
        stage=ns.stage,
        config=ns.config.resolve(),
        layers_dir=ns.layers_dir.resolve(),
        outdir=ns.outdir.resolve(),
        build=ns.build,
        assembly=ns.assembly.resolve() if ns.assembly else None,
        parameters=tuple(ns.parameters),
        approve=ns.yes,
    )


def main(argv: Sequence[str] | None = None) -> int:
    plan = parse_args(argv)
    try:
        deploy(plan, os.environ)
    except DeployError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
