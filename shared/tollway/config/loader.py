"""Read ``llm-router.yml``: interpolate ``${NAME:default}``, parse YAML, check shape, then semantics.

Every stage reports problems as ``ConfigIssue`` objects inside one ``ConfigError``: text
positions (``line 12, column 3``) before the YAML is parsed, YAML paths
(``models[0].routes[1].priority``) after. No message ever carries an environment value.
Warnings (``tollway.config.validate.check``) do not fail a load: ``load_config_with_warnings``
returns them to the callers that report them (``tollway config validate``, the runtime's log).
"""

from __future__ import annotations

import os
import re
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from tollway.config.schema import RouterConfig
from tollway.config.validate import check, yaml_path
from tollway.exceptions import ConfigError, ConfigIssue

__all__ = ["interpolate", "load_config", "load_config_with_warnings", "load_yaml", "parse_config"]

_PLACEHOLDER = re.compile(
    r"^[ \t]*#[^\n]*"
    r"|\$\$\{"
    r"|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?::(?P<default>[^}\r\n]*))?\}"
    r"|\$\{",
    re.MULTILINE,
)

_TYPE_MESSAGES = {
    "missing": "field required",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "string_too_short": "must not be empty",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
}


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Replace ``${NAME}`` and ``${NAME:default}`` from ``env``; ``$${`` stands for a literal ``${``.

    Whole-line comments are left untouched, so a commented-out ``${OLD_URL}`` needs no variable.
    Substitution is one pass: a value that itself contains ``${`` is not expanded again. A value
    with a line break is refused because it could add keys to the document.
    """
    issues: list[ConfigIssue] = []

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "$${":
            return "${"
        if not token.startswith("$"):
            return token
        name = match.group("name")
        where = _position(text, match.start())
        if name is None:
            issues.append(
                ConfigIssue(where, "malformed placeholder; use ${NAME} or ${NAME:default} ($${ for a literal)")
            )
            return token
        value = env.get(name)
        if value is None:
            default = match.group("default")
            if default is None:
                issues.append(ConfigIssue(where, f"environment variable {name!r} is not set and has no default"))
                return token
            return default
        if "\n" in value or "\r" in value:
            issues.append(ConfigIssue(where, f"environment variable {name!r} contains a line break"))
            return token
        return value

    result = _PLACEHOLDER.sub(replace, text)
    if issues:
        raise ConfigError(issues)
    return result


def load_yaml(path: Path, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The interpolated YAML mapping in ``path``; ``env`` defaults to the process environment."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError([ConfigIssue("", f"config file {str(path)!r} is not valid UTF-8")]) from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError([ConfigIssue("", f"cannot read config file {str(path)!r}: {reason}")]) from None
    text = interpolate(text, os.environ if env is None else env)
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError([ConfigIssue(where, exc.problem or exc.context or "invalid YAML")]) from None
    except yaml.YAMLError:
        raise ConfigError([ConfigIssue("", "invalid YAML")]) from None
    if not isinstance(data, dict):
        raise ConfigError([ConfigIssue("", "the top level must be a mapping of configuration keys")])
    return data


def parse_config(data: dict[str, Any]) -> RouterConfig:
    """Check the shape of ``data`` (strict types: YAML already gives ints and booleans)."""
    try:
        return RouterConfig.model_validate(data, strict=True)
    except ValidationError as exc:
        raise ConfigError([_issue(err) for err in exc.errors(include_url=False, include_input=False)]) from None


def load_config(path: Path, env: Mapping[str, str] | None = None) -> RouterConfig:
    """Load, parse and validate ``path``; raises ``ConfigError`` listing every problem found."""
    return load_config_with_warnings(path, env)[0]


def load_config_with_warnings(
    path: Path, env: Mapping[str, str] | None = None
) -> tuple[RouterConfig, list[ConfigIssue]]:
    """:func:`load_config`, and the warnings of the valid config it returns."""
    cfg = parse_config(load_yaml(path, env))
    errors, warnings = check(cfg)
    if errors:
        raise ConfigError(errors)
    return cfg, warnings


def _position(text: str, offset: int) -> str:
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return f"line {line}, column {column}"


def _issue(err: ErrorDetails) -> ConfigIssue:
    """A pydantic error as a concise issue. Never uses the offending input, which may be a secret."""
    kind, ctx, parts = err["type"], err.get("ctx"), list(err["loc"])
    if parts and parts[-1] == "[key]":
        return ConfigIssue(yaml_path(*parts[:-1]), "keys must be strings")
    path = yaml_path(*parts)
    if kind == "extra_forbidden":
        return ConfigIssue(path, f"unknown key {str(parts[-1])!r}")
    if kind == "literal_error" and ctx and "expected" in ctx:
        return ConfigIssue(path, f"must be {ctx['expected']}")
    return ConfigIssue(path, _TYPE_MESSAGES.get(kind) or err["msg"])


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that refuses duplicate mapping keys instead of silently keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"duplicate key {key_node.value!r}",
                        key_node.start_mark,
                    )
                seen.add(key)
        return super().construct_mapping(node, deep)
