"""Summarizing py-spy's collapsed stacks into where the gateway's time goes."""

from __future__ import annotations

from pathlib import Path

from bench.pyspy import summarize_collapsed

PROC = (
    'process 1:"python -m tollway.cli serve";'
    'process 2:"python -B -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5) --fork"'
)
HANDLER = "chat_completions (tollway/server/app.py:160)"
STREAM = "ProviderTransport.stream (tollway/transport/http.py:141)"


def test_samples_are_attributed_to_leaf_package_and_tollway_callers(tmp_path: Path) -> None:
    raw = tmp_path / "stacks.txt"
    raw.write_text(
        "\n".join(
            [
                f"{PROC};{HANDLER};{STREAM};AsyncHTTP11Connection._receive_event (httpcore/_async/http11.py:200) 6",
                f"{PROC};{HANDLER};dumps (orjson/__init__.py:1) 3",
                f"{PROC};Runner.run (asyncio/runners.py:118) 1",
                "not a stack line",
            ]
        )
        + "\n"
    )
    summary = summarize_collapsed(raw)
    assert summary["samples"] == 10
    packages = {p["name"]: p["pct"] for p in summary["by_package"]}
    assert packages == {"httpcore": 60.0, "orjson": 30.0, "asyncio": 10.0}
    assert summary["self"][0] == {"name": "AsyncHTTP11Connection._receive_event (httpcore)", "samples": 6, "pct": 60.0}
    inclusive = {p["name"]: p["samples"] for p in summary["inclusive"]}
    assert inclusive == {"chat_completions (tollway.server)": 9, "ProviderTransport.stream (tollway.transport)": 6}


def test_an_empty_profile_has_no_shares(tmp_path: Path) -> None:
    raw = tmp_path / "empty.txt"
    raw.write_text("")
    assert summarize_collapsed(raw) == {"samples": 0, "by_package": [], "self": [], "inclusive": []}
