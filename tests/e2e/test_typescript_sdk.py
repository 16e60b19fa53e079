"""The official TypeScript SDKs (npm ``openai`` for Chat Completions, Responses and Embeddings,
``@anthropic-ai/sdk`` for Messages) against the same running gateway."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.processes import Gateway
from tollway.mock.openai_embeddings import mock_embedding

pytestmark = pytest.mark.e2e

TS_DIR = Path(__file__).parent / "ts"
EMBEDDING_DIMENSIONS = 8
EMBED_TEXTS = ["typescript embeds this", "and this too"]


def test_typescript_sdk_buffered_and_streamed(gateway: Gateway) -> None:
    node = shutil.which("node")
    assert node, "Node.js 20 is required for the TypeScript SDK e2e test"
    for package in ("openai", "@anthropic-ai/sdk"):
        assert (TS_DIR / "node_modules" / package).is_dir(), "run `make test` (it runs npm ci in tests/e2e/ts)"
    env = {
        **os.environ,
        "TOLLWAY_BASE_URL": gateway.base_url,
        "TOLLWAY_API_KEY": gateway.keys["team-a"],
        "TOLLWAY_MODEL": "chat-fast-v1",
        "TOLLWAY_ANTHROPIC_MODEL": "chat-claude-v1",
        "TOLLWAY_EMBEDDING_MODEL": "embed-v1",
        "TOLLWAY_EMBEDDING_DIMENSIONS": str(EMBEDDING_DIMENSIONS),
        "TOLLWAY_EMBEDDING_EXPECTED": json.dumps(
            {t: list(mock_embedding(t, EMBEDDING_DIMENSIONS)) for t in EMBED_TEXTS}
        ),
    }
    result = subprocess.run(
        [node, "--test", "--test-reporter=spec"], cwd=TS_DIR, env=env, capture_output=True, text=True, timeout=120
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "# fail 0" in output or "fail 0" in output, output
    # 6 Chat Completions, 8 Messages, 2 Responses, 2 Embeddings
    assert "# pass 18" in output or "pass 18" in output, output
