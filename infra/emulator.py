"""The two calls the deploy script makes to a local cloud itself, run as a child process.

``python -m infra.deploy`` runs this module with the local environment only (dummy credentials,
the emulator's endpoint, no ``AWS_PROFILE``), so boto3 here cannot pick up a real account's
settings from the caller's shell, as it would inside the deploy process.

    python -m infra.emulator adapter-placeholder STAGE   # prints the placeholder layer's ARN
    python -m infra.emulator resources STACK...          # lists what each stack created
    python -m infra.emulator existing STACK...           # prints the stacks that already exist
    python -m infra.emulator converge STAGE              # applies what moto's CloudFormation skips
"""

from __future__ import annotations

import io
import os
import sys
import zipfile
from collections.abc import Sequence
from typing import Any

__all__ = ["converge", "existing_stacks", "main", "publish_adapter_placeholder", "stack_resources"]


def _client(service: str) -> Any:
    import boto3  # deferred: only this child process talks to the emulator

    return boto3.client(service)


def publish_adapter_placeholder(stage: str) -> str:
    """Publish a stand-in for the Lambda Web Adapter layer and return its ARN.

    An emulator cannot fetch AWS's public Lambda Web Adapter layer; it runs no Lambda code
    either, so the stand-in's content does not matter, only that the ARN names a layer it holds.
    """
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("bootstrap", "#!/bin/sh\necho 'placeholder: the local cloud runs no Lambda code' >&2\nexit 1\n")
    published = _client("lambda").publish_layer_version(
        LayerName=f"{stage}-lambda-adapter-placeholder",
        Description="Stand-in for AWS's public Lambda Web Adapter layer on a local cloud",
        Content={"ZipFile": archive.getvalue()},
        CompatibleRuntimes=["python3.13"],  # the stack's runtime (infra.constructs.function.RUNTIME)
    )
    return str(published["LayerVersionArn"])


def stack_resources(stack: str) -> list[tuple[str, str]]:
    """(type, physical id) of each resource the emulator created for ``stack``."""
    pages = _client("cloudformation").get_paginator("list_stack_resources").paginate(StackName=stack)
    return [
        (r["ResourceType"], r["PhysicalResourceId"])
        for page in pages
        for r in page["StackResourceSummaries"]
        if r.get("PhysicalResourceId")
    ]


def existing_stacks(stacks: Sequence[str]) -> list[str]:
    """The names in ``stacks`` the emulator holds a live (not deleted) stack for."""
    live = {
        summary["StackName"]
        for page in _client("cloudformation").get_paginator("list_stacks").paginate()
        for summary in page["StackSummaries"]
        if summary["StackStatus"] != "DELETE_COMPLETE"
    }
    return [s for s in stacks if s in live]


def converge(stage: str) -> str:
    """Bring the stage's queues, tables and buckets to their spec; return the report.

    moto's CloudFormation creates them but ignores some properties (a table's TTL and
    point-in-time recovery, a bucket's versioning, lifecycle and public access block); the local
    cloud bootstrap sets them from the same topology the stack was built from. It is idempotent:
    where the emulator applied everything it changes nothing.
    """
    from tollway.cloud.bootstrap import bootstrap
    from tollway.cloud.resources import topology

    endpoint, region = os.environ["AWS_ENDPOINT_URL"], os.environ["AWS_REGION"]
    return bootstrap(topology(stage), endpoint=endpoint, region=region, env=os.environ).summary()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "adapter-placeholder":
        print(publish_adapter_placeholder(args[1]))
        return 0
    if len(args) >= 2 and args[0] == "resources":
        for stack in args[1:]:
            print(f"Resources of {stack}:")
            for kind, physical_id in stack_resources(stack):
                print(f"  {kind:<32} {physical_id}")
        return 0
    if len(args) == 2 and args[0] == "converge":
        print(converge(args[1]))
        return 0
    if len(args) >= 2 and args[0] == "existing":
        for stack in existing_stacks(args[1:]):
            print(stack)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
