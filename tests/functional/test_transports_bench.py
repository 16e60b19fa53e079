"""``python -m bench.transports`` runs every client against the real mock and prints its table.
No timing is asserted."""

from __future__ import annotations

import re

import pytest

from bench.transports import main


def test_bench_measures_every_client_beside_the_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--requests", "40", "--concurrency", "2", "--repeat", "1"]) == 0
    rows = re.findall(r"^\| (.+?) \| (\d+) µs \((\d+)-(\d+)\) \| ([\d.]+)x \|$", capsys.readouterr().out, re.M)
    assert [label for label, *_ in rows] == [
        "baseline (bench.clients.Http1Client)",
        "`httpClient: h1`",
        "`httpClient: aiohttp`",
        "`httpClient: httpx`",
    ]
    assert all(int(us) > 0 and float(ratio) > 0 for _, us, _, _, ratio in rows)
    assert rows[0][4] == "1.00"


def test_unknown_clients_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--clients", "h1,curl"])
    assert info.value.code == 2
    assert "curl" in capsys.readouterr().err
