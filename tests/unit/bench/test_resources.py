"""The resource sampler's window: CPU per group, other processes, and the hypervisor's steal."""

from __future__ import annotations

import os

from bench.resources import ResourceSampler, Sample, read_steal

TICK = os.sysconf("SC_CLK_TCK")


def sample(t: float, gateway_ticks: int, steal: int | None) -> Sample:
    return Sample(t, {"gateway": (gateway_ticks, 50 << 20, (50 << 20,))}, {}, steal)


def sampler(samples: list[Sample]) -> ResourceSampler:
    s = ResourceSampler({"gateway": 1})
    s.samples = samples
    return s


def test_steal_is_reported_per_core_as_a_mean_and_the_worst_step() -> None:
    # Over 2 s: half a core stolen in the first second, none in the second.
    samples = [sample(0.0, 0, 1000), sample(1.0, TICK, 1000 + TICK // 2), sample(2.0, 2 * TICK, 1000 + TICK // 2)]
    out = sampler(samples).window(0.0, 2.0)
    assert out["steal_pct"] == 25.0 and out["steal_pct_max"] == 50.0
    assert out["gateway"]["cpu_pct_mean"] == 100.0


def test_no_steal_figures_where_the_kernel_gives_none() -> None:
    out = sampler([sample(0.0, 0, None), sample(1.0, TICK, None)]).window(0.0, 1.0)
    assert "steal_pct" not in out and out["gateway"]["cpu_s"] == 1.0


def test_read_steal_takes_the_eighth_value_of_the_cpu_line() -> None:
    assert read_steal("cpu  2926329 84738 484705 8138837 40653 0 103724 144884 0 0\n") == 144884
    assert read_steal("cpu  1 2 3 4\n") is None, "an old kernel without the steal column"
    assert read_steal("intr 1 2 3 4 5 6 7 8 9\n") is None
    live = read_steal()
    assert live is None or live >= 0
