"""The deploy script's environment and arguments: no real credential reaches a local cloud or the output."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra import deploy
from infra.deploy import DeployError, aws_environment, local_environment, parse_args
from tollway.cloud.local import free_port

REAL = {
    "AWS_ACCESS_KEY_ID": "AKIAREALREALREAL",
    "AWS_SECRET_ACCESS_KEY": "real-secret-never-shown",
    "AWS_SESSION_TOKEN": "real-session-token",
    "AWS_PROFILE": "prod",
    "AWS_ROLE_ARN": "arn:aws:iam::111111111111:role/deployer",
    "HOME": "/home/someone",
}


def test_local_environment_drops_every_caller_aws_variable_and_uses_dummy_credentials() -> None:
    env = local_environment({**REAL, "AWS_ENDPOINT_URL": "http://127.0.0.1:4599/"})
    assert env["AWS_ACCESS_KEY_ID"] == "test"
    assert env["AWS_SECRET_ACCESS_KEY"] == "test"
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ROLE_ARN"):
        assert name not in env
    assert not set(env.values()) & {v for k, v in REAL.items() if k.startswith("AWS_")}
    assert env["HOME"] == "/home/someone"
    assert env["AWS_ENDPOINT_URL"] == env["AWS_ENDPOINT_URL_S3"] == "http://127.0.0.1:4599"
    assert env["AWS_ENDPOINT_URL_S3_FOR_CLOUDFORMATION"] == "http://localhost:4599"
    assert env["AWS_REGION"] == env["AWS_DEFAULT_REGION"] == "us-east-1"
    assert set(env["AWS_ENVAR_ALLOWLIST"].split(",")) == {"AWS_REGION", "AWS_DEFAULT_REGION"}


def test_local_environment_defaults_to_the_edge_port_and_keeps_a_remote_emulator_as_is() -> None:
    assert local_environment({})["AWS_ENDPOINT_URL"] == "http://127.0.0.1:4566"
    remote = local_environment({"AWS_ENDPOINT_URL": "http://localstack:4566", "AWS_REGION": "eu-west-1"})
    assert remote["AWS_ENDPOINT_URL_S3"] == "http://localstack:4566"
    assert "AWS_ENDPOINT_URL_S3_FOR_CLOUDFORMATION" not in remote
    assert remote["AWS_DEFAULT_REGION"] == "eu-west-1"


def test_aws_environment_keeps_the_caller_credentials_but_never_an_emulator_endpoint() -> None:
    env = aws_environment({**REAL, "AWS_ENDPOINT_URL": "http://127.0.0.1:4566", "AWS_ENDPOINT_URL_S3": "x"})
    assert env["AWS_SECRET_ACCESS_KEY"] == REAL["AWS_SECRET_ACCESS_KEY"]
    assert not [k for k in env if k.startswith("AWS_ENDPOINT_URL")]


def test_arguments_parse_into_a_plan() -> None:
    plan = parse_args(
        ["--target", "local", "--stage", "dev-1", "--no-build", "--parameter", "GatewayMemorySize=2048", "--yes"]
    )
    assert (plan.target, plan.stage, plan.build, plan.approve) == ("local", "dev-1", False, True)
    assert plan.parameters == (("GatewayMemorySize", "2048"),)
    assert plan.cli.name == "cdklocal"
    assert parse_args(["--target", "aws"]).cli.name == "cdk"
    assert parse_args(["--target", "aws"]).layers_dir.parts[-2:] == ("layers", "dist")


@pytest.mark.parametrize(
    "argv",
    [["--target", "gcp"], ["--target", "aws", "--stage", "Bad_Stage"], ["--target", "aws", "--parameter", "novalue"]],
)
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_an_unreachable_local_cloud_fails_before_any_step_without_printing_credentials(
    capsys: pytest.CaptureFixture[str],
) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    plan = parse_args(["--target", "local", "--no-build"])
    with pytest.raises(DeployError, match="no local cloud answers at " + endpoint):
        deploy.deploy(plan, {**REAL, "AWS_ENDPOINT_URL": endpoint})
    out = capsys.readouterr()
    assert REAL["AWS_SECRET_ACCESS_KEY"] not in out.out + out.err


def test_missing_layers_fail_with_the_build_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = parse_args(["--target", "aws", "--no-build", "--layers-dir", str(tmp_path)])
    with pytest.raises(DeployError, match=r"build the layers first: python -m layers\.build --out"):
        deploy.deploy(plan, REAL)
    assert REAL["AWS_SECRET_ACCESS_KEY"] not in capsys.readouterr().out


def test_each_emulator_account_gets_a_cdk_cache_of_its_own(tmp_path: Path) -> None:
    from infra.deploy import local_cdk_home

    moto = local_cdk_home(tmp_path, "123456789012")
    localstack = local_cdk_home(tmp_path, "000000000000")
    assert moto != localstack
    assert moto == tmp_path / ".tollway" / "cdk-home" / "123456789012"
