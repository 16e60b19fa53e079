"""Peers that cannot run are reported with a reason instead of failing the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import peers
from bench.peers import PeerError, start_peer


@pytest.mark.parametrize("name", ["litellm", "portkey"])
def test_a_peer_that_is_not_installed_fails_with_the_install_command(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peers, "PEERS_DIR", tmp_path / "nothing-here")
    with pytest.raises(PeerError, match=f"python -m bench.peers install {name}"):
        start_peer(name, tmp_path, "http://127.0.0.1:9", "", 1, "key")


def test_an_unknown_peer_is_refused() -> None:
    with pytest.raises(PeerError, match="unknown peer"):
        start_peer("bifrost", Path("."), "http://127.0.0.1:9", "", 1, "key")


def test_the_portkey_pins_keep_the_node_server_override() -> None:
    package = (peers.BENCH_DIR / "peers" / "portkey" / "package.json").read_text()
    assert '"@hono/node-server": "1.13.5"' in package
    assert '"@portkey-ai/gateway": "1.15.2"' in package
    requirements = (peers.BENCH_DIR / "peers" / "litellm" / "requirements.txt").read_text()
    assert "litellm[proxy]==1.108." in requirements
