"""An embeddings alias compiled into its plan: operation, client format, batch bound, codecs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tollway.config.loader import parse_config
from tollway.config.root import Publisher
from tollway.config.validate import validate
from tollway.secrets import SecretResolver


def doc(embed: dict[str, Any]) -> dict[str, Any]:
    provider = {
        "type": "openai-compatible",
        "baseUrl": "http://127.0.0.1:9/v1",
        "providerAccountId": "acct",
        "quotaGroupId": "group",
        "credentials": [{"id": "c", "secretRef": "env:KEY"}],
    }
    route = {"provider": "p", "providerFormat": "openai-chat-completions"}
    return {
        "providers": {"p": provider},
        "models": [
            {"name": "chat", "routes": [{"id": "r-chat", "model": "small", **route}]},
            {"name": "embed", **embed, "routes": [{"id": "r-embed", "model": "embed-small", **route}]},
        ],
        "principals": [
            {"id": "a", "tenant": "t", "allowedModels": ["chat", "embed"], "keys": [{"id": "k", "sha256": "a" * 64}]}
        ],
    }


@pytest.fixture
def publisher(tmp_path: Path) -> Iterator[Publisher]:
    yield Publisher(resolver=SecretResolver(env={"KEY": "sk"}), config_dir=tmp_path)


def test_an_embeddings_alias_is_served_over_the_embeddings_api_only(publisher: Publisher) -> None:
    cfg = parse_config(doc({"operations": ["embeddings"], "maxEmbeddingInputs": 16}))
    assert validate(cfg) == []
    root = publisher.publish(cfg)
    embed, chat = root.aliases["embed"], root.aliases["chat"]
    assert (embed.operation, embed.client_formats, embed.max_embedding_inputs) == (
        "embeddings",
        frozenset({"openai-embeddings"}),
        16,
    )
    assert chat.operation == "chat" and "openai-embeddings" not in chat.client_formats
    (target,) = embed.groups[0]
    assert target.deployment.embeddings is not None


def test_an_explicit_embeddings_client_format_is_kept(publisher: Publisher) -> None:
    cfg = parse_config(doc({"operations": ["embeddings"], "clientFormats": ["openai-embeddings"]}))
    assert validate(cfg) == []
    assert publisher.publish(cfg).aliases["embed"].client_formats == frozenset({"openai-embeddings"})
