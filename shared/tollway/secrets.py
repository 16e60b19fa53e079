"""Secret references: the only way a credential enters Tollway.

A reference is ``env:NAME`` (local) or ``aws-sm:<secret-id>[#json-key]`` (Secrets Manager).
The resolved value is wrapped in ``Secret``, whose ``repr``/``str`` never show it, so a
credential cannot leak through a log line, an exception message or a debugger print.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from tollway.exceptions import ConfigError, ConfigIssue

__all__ = ["Secret", "SecretResolver"]


class Secret:
    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> Any:
        raise TypeError("Secret values are not serializable")


SecretsManagerFetch = Callable[[str], str]


def _default_sm_fetch(secret_id: str) -> str:
    import boto3  # deferred: boto3 is heavy and only needed on AWS

    client = boto3.client("secretsmanager")
    value = client.get_secret_value(SecretId=secret_id)
    return str(value["SecretString"])


class SecretResolver:
    """Resolves references at publication time (never on the request path)."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        sm_fetch: SecretsManagerFetch | None = None,
    ) -> None:
        self._env = os.environ if env is None else env
        self._sm_fetch = sm_fetch or _default_sm_fetch
        self._sm_cache: dict[str, str] = {}

    def resolve(self, ref: str, path: str) -> Secret:
        if ref.startswith("env:"):
            name = ref[4:]
            value = self._env.get(name)
            if not value:
                raise ConfigError([ConfigIssue(path, f"environment variable {name} is not set or empty")])
            return Secret(value)
        if ref.startswith("aws-sm:"):
            secret_id, _, json_key = ref[7:].partition("#")
            try:
                raw = self._sm_cache.get(secret_id)
                if raw is None:
                    raw = self._sm_fetch(secret_id)
                    self._sm_cache[secret_id] = raw
            except Exception as exc:  # any SDK failure is reported without its payload
                raise ConfigError(
                    [ConfigIssue(path, f"secret {secret_id} could not be read ({type(exc).__name__})")]
                ) from None
            if json_key:
                try:
                    raw = str(json.loads(raw)[json_key])
                except (ValueError, KeyError, TypeError):
                    raise ConfigError([ConfigIssue(path, f"secret {secret_id} has no JSON key {json_key}")]) from None
            return Secret(raw)
        raise ConfigError([ConfigIssue(path, "secretRef must start with env: or aws-sm:")])
