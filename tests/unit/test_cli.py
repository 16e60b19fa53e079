"""``tollway`` CLI helpers that restate a name from the resource spec must agree with it."""

from __future__ import annotations

from tollway.cli import local_audit_queue, local_environment
from tollway.cloud.resources import DEFAULT_PREFIX, topology


def test_local_audit_queue_is_the_specs_audit_queue() -> None:
    assert local_audit_queue(DEFAULT_PREFIX) == topology(DEFAULT_PREFIX).queue("audit").name
    assert local_audit_queue("e2e") == topology("e2e").queue("audit").name


def test_up_names_the_stages_resources_as_the_topology_does() -> None:
    for stage in (DEFAULT_PREFIX, "e2e"):
        spec = topology(stage).environment("000000000000", "us-east-1")
        for name, value in local_environment(stage).items():
            assert spec[name] == value, name
