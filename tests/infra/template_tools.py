"""Reading a synthesized template: resolve pseudo parameters, follow references, walk policies."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

ACCOUNT = "123456789012"
REGION = "eu-west-1"
PSEUDO = {"AWS::AccountId": ACCOUNT, "AWS::Region": REGION, "AWS::Partition": "aws", "AWS::URLSuffix": "amazonaws.com"}


def resolve(value: Any) -> Any:
    """Evaluate ``Fn::Join`` and pseudo-parameter ``Ref``s, so a value compares with a spec's string."""
    if isinstance(value, dict) and len(value) == 1:
        ((fn, arg),) = value.items()
        if fn == "Ref" and arg in PSEUDO:
            return PSEUDO[arg]
        if fn == "Fn::Join":
            sep, parts = arg
            resolved = [resolve(p) for p in parts]
            if all(isinstance(p, str) for p in resolved):
                return sep.join(resolved)
    return value


def refs(value: Any) -> set[str]:
    """Every logical id ``value`` points at through ``Ref`` or ``Fn::GetAtt``."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, inner in value.items():
            if key == "Ref" and isinstance(inner, str) and not inner.startswith("AWS::"):
                found.add(inner)
            elif key == "Fn::GetAtt":
                found.add(inner[0])
            else:
                found |= refs(inner)
    elif isinstance(value, list):
        for inner in value:
            found |= refs(inner)
    return found


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def statements(template: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(logical id, statement) for every policy statement anywhere in the template."""

    def walk(logical_id: str, value: Any) -> Iterator[tuple[str, dict[str, Any]]]:
        if isinstance(value, dict):
            if isinstance(value.get("Statement"), list):
                for statement in value["Statement"]:
                    yield logical_id, statement
            for inner in value.values():
                yield from walk(logical_id, inner)
        elif isinstance(value, list):
            for inner in value:
                yield from walk(logical_id, inner)

    for logical_id, resource in template.get("Resources", {}).items():
        yield from walk(logical_id, resource)


def wildcard_statements(template: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Statements whose actions include ``*`` and whose resources include ``*``."""
    return [
        (logical_id, s)
        for logical_id, s in statements(template)
        if "*" in as_list(s.get("Action", [])) and "*" in as_list(s.get("Resource", []))
    ]


def role_statements(template: dict[str, Any], role_id: str) -> list[dict[str, Any]]:
    """The statements of every inline policy attached to ``role_id``."""
    result: list[dict[str, Any]] = []
    for resource in template["Resources"].values():
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::IAM::Policy" and {"Ref": role_id} in props.get("Roles", []):
            result.extend(props["PolicyDocument"]["Statement"])
    role = template["Resources"][role_id]["Properties"]
    for policy in role.get("Policies", []):
        result.extend(policy["PolicyDocument"]["Statement"])
    return result


def actions_on(stmts: list[dict[str, Any]], logical_id: str) -> set[str]:
    """Actions the statements allow on resources that reference ``logical_id``."""
    return {
        action
        for s in stmts
        if s["Effect"] == "Allow" and logical_id in refs(s.get("Resource"))
        for action in as_list(s["Action"])
    }
