"""The dashboard renderer's PromQL evaluator on hand-made scrapes, and docs/grafana/tollway.json itself."""

from __future__ import annotations

import io
import math
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench import dashboard
from bench.dashboard import (
    DASHBOARD,
    Evaluator,
    Scrape,
    UnsupportedQuery,
    dashboard_queries,
    expand,
    histogram_quantile,
    metric_names,
    parse_query,
    parse_scrape,
    render,
)

ROOT = Path(__file__).resolve().parents[3]
OBSERVABILITY = ROOT / "docs" / "observability.md"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
VARIABLES = {"alias": ".*", "environment": ".*", "__rate_interval": "1m"}


def scrape(t: float, body: str) -> Scrape:
    """A scrape from exposition-format lines (``# TYPE`` lines are added by the caller when needed)."""
    return parse_scrape(body.strip() + "\n", t)


def counters(t: float, **series: float) -> Scrape:
    """``req_total`` with one series per ``alias=value`` keyword, in environment "test"."""
    lines = ["# TYPE req counter"]
    lines += [f'req_total{{alias="{alias}",environment="test"}} {value}' for alias, value in series.items()]
    return scrape(t, "\n".join(lines))


def at(evaluator: Evaluator, expr: str, t: float) -> dict[tuple[tuple[str, str], ...], float]:
    return evaluator.query(expr, t)


# -- rate ---------------------------------------------------------------------------------


def test_rate_is_the_increase_between_the_windows_first_and_last_sample_over_their_distance() -> None:
    ev = Evaluator([counters(0, a=0), counters(10, a=20), counters(20, a=50)])
    assert at(ev, "rate(req_total[1m])", 20) == {(("alias", "a"), ("environment", "test")): 2.5}
    # the window is left-open, as in Prometheus 3: (10, 20] holds one sample, which makes no rate
    assert at(ev, "rate(req_total[10s])", 20) == {}
    assert at(ev, "rate(req_total[11s])", 20) == {(("alias", "a"), ("environment", "test")): 3.0}


def test_rate_counts_the_value_after_a_counter_reset_as_the_increase() -> None:
    ev = Evaluator([counters(0, a=10), counters(10, a=30), counters(20, a=5), counters(30, a=25)])
    key = (("alias", "a"), ("environment", "test"))
    # (0, 30]: 30 -> 5 is a reset (+5), 5 -> 25 (+20), over 20 s
    assert at(ev, "rate(req_total[30s])", 30) == {key: pytest.approx(25 / 20)}
    # [0, 30]: +20, +5, +20 over 30 s
    assert at(ev, "rate(req_total[31s])", 30) == {key: pytest.approx(45 / 30)}


def test_a_series_born_inside_the_window_starts_at_its_first_sample() -> None:
    ev = Evaluator([counters(0, a=1), counters(10, a=2, b=1), counters(20, a=3, b=1)])
    assert at(ev, "sum by (alias) (rate(req_total[1m]))", 20) == {(("alias", "a"),): 0.1, (("alias", "b"),): 0.0}


def test_rate_is_evaluated_at_any_time_from_the_scrapes_at_or_before_it() -> None:
    ev = Evaluator([counters(0, a=0), counters(10, a=10), counters(20, a=40)])
    assert at(ev, "sum(rate(req_total[1m]))", 15) == {(): 1.0}


# -- sum, matchers, scalars ----------------------------------------------------------------


MIXED = """
# TYPE requests counter
requests_total{alias="a",status_class="2xx",error_category="",environment="prod"} 10
requests_total{alias="a",status_class="4xx",error_category="model_not_found",environment="prod"} 4
requests_total{alias="b",status_class="2xx",error_category="",environment="prod"} 6
requests_total{alias="b",status_class="5xx",error_category="upstream_error",environment="dev"} 2
requests_total{alias="",status_class="4xx",error_category="authentication_error",environment="prod"} 8
"""


def mixed() -> Evaluator:
    zero = re.sub(r"} \d+", "} 0", MIXED)
    return Evaluator([scrape(0, zero), scrape(10, MIXED)])


def test_sum_by_groups_on_the_named_labels_and_drops_the_rest() -> None:
    ev = mixed()
    assert at(ev, "sum by (status_class) (rate(requests_total[1m]))", 10) == {
        (("status_class", "2xx"),): pytest.approx(1.6),
        (("status_class", "4xx"),): pytest.approx(1.2),
        (("status_class", "5xx"),): pytest.approx(0.2),
    }
    assert at(ev, "sum(rate(requests_total[1m]))", 10) == {(): pytest.approx(3.0)}


def test_an_empty_label_groups_with_a_missing_one_and_is_left_out_of_the_result() -> None:
    result = at(mixed(), "sum by (alias) (rate(requests_total[1m]))", 10)
    assert result == {(("alias", "a"),): pytest.approx(1.4), (("alias", "b"),): pytest.approx(0.8), (): 0.8}


def test_the_four_matchers_are_anchored_like_prometheus() -> None:
    ev = mixed()
    query = 'sum by (alias) (rate(requests_total{alias=~"a|b", environment="prod", status_class!="2xx"}[1m]))'
    assert at(ev, query, 10) == {(("alias", "a"),): 0.4}
    assert at(ev, 'sum(rate(requests_total{alias=~"."}[1m]))', 10) == {(): pytest.approx(2.2)}
    assert at(ev, 'sum(rate(requests_total{alias!~"a|b"}[1m]))', 10) == {(): pytest.approx(0.8)}
    assert at(ev, 'sum(rate(requests_total{environment=~"pro"}[1m]))', 10) == {}
    # Grafana's "All" is .*, which also matches the empty alias of a request for an unknown model
    assert at(ev, 'sum(rate(requests_total{alias=~".*"}[1m]))', 10) == {(): pytest.approx(3.0)}


def test_a_number_times_a_vector_scales_every_value() -> None:
    ev = mixed()
    assert at(ev, "3600 * sum by (alias) (rate(requests_total[1m]))", 10)[(("alias", "b"),)] == pytest.approx(2880)
    assert at(ev, "sum(rate(requests_total[1m])) * 2", 10) == {(): pytest.approx(6.0)}


def test_gauges_read_the_latest_scrape_and_a_series_missing_from_it_is_stale() -> None:
    ev = Evaluator(
        [
            scrape(0, '# TYPE active gauge\nactive{worker="0"} 3\nactive{worker="1"} 4'),
            scrape(2, '# TYPE active gauge\nactive{worker="0"} 5'),
        ]
    )
    assert at(ev, "sum(active)", 1) == {(): 7.0}
    assert at(ev, "sum(active)", 2) == {(): 5.0}
    assert at(ev, "sum by (worker) (active)", 3) == {(("worker", "0"),): 5.0}
    assert at(ev, "sum(active)", -1) == {}
    assert at(ev, "sum(active)", 2 + 301) == {}  # past Prometheus' 5-minute lookback


@pytest.mark.parametrize(
    "query",
    [
        "avg(rate(req_total[1m]))",
        "sum without (alias) (rate(req_total[1m]))",
        "increase(req_total[1m])",
        "sum(rate(req_total[1m] offset 1m))",
        "sum(rate(req_total[1m])) / 2",
        "sum(rate(req_total[1m])) * sum(rate(req_total[1m]))",
        "topk(1, req_total)",
        "sum by (",
    ],
)
def test_anything_outside_the_subset_is_refused(query: str) -> None:
    with pytest.raises(UnsupportedQuery):
        Evaluator([counters(0, a=1), counters(10, a=2)]).query(query, 10)


def test_grafana_variables_are_replaced_and_an_unknown_one_is_refused() -> None:
    expr = 'rate(m{alias=~"$alias", env=~"${environment}"}[$__rate_interval])'
    assert expand(expr, VARIABLES) == 'rate(m{alias=~".*", env=~".*"}[1m])'
    with pytest.raises(UnsupportedQuery, match=r"\$missing"):
        expand("rate(m[$missing])", VARIABLES)


# -- histogram_quantile --------------------------------------------------------------------


def test_histogram_quantile_interpolates_linearly_within_the_bucket() -> None:
    # 100 observations spread evenly over (0, 1]: ten buckets of ten
    buckets = [(i / 10, 10.0 * i) for i in range(1, 11)] + [(math.inf, 100.0)]
    for q in (0.05, 0.25, 0.5, 0.9, 0.95, 0.99):
        assert histogram_quantile(q, buckets) == pytest.approx(q)
    # 25 of 40 observations in the first bucket: the rank 20 is 4/5 into (0, 0.1]
    assert histogram_quantile(0.5, [(0.1, 25.0), (0.2, 40.0), (math.inf, 40.0)]) == pytest.approx(0.08)


def test_histogram_quantile_edges_are_prometheus_own() -> None:
    tail = [(0.1, 50.0), (0.5, 90.0), (math.inf, 100.0)]
    assert histogram_quantile(0.99, tail) == 0.5  # a rank in the +Inf bucket: the highest finite bound
    assert math.isnan(histogram_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]))  # no observations
    assert math.isnan(histogram_quantile(0.5, [(0.1, 1.0), (0.2, 2.0)]))  # no +Inf bucket
    assert math.isnan(histogram_quantile(0.5, [(math.inf, 2.0)]))  # fewer than two buckets
    assert histogram_quantile(-0.1, tail) == -math.inf
    assert histogram_quantile(1.1, tail) == math.inf
    assert histogram_quantile(0.5, [(-1.0, 5.0), (0.0, 10.0), (math.inf, 10.0)]) == -1.0
    # buckets given twice are summed (le="0.2" and le="0.20"), and a count below the one before it is
    # raised to it: 0.1 -> 3, 0.2 -> 10, 0.3 -> 10, the rank 10 is the end of (0.1, 0.2]
    assert histogram_quantile(0.5, [(0.2, 5.0), (0.1, 3.0), (0.2, 5.0), (0.3, 9.0), (math.inf, 20.0)]) == (
        pytest.approx(0.2)
    )
    assert histogram_quantile(0.5, [(0.1, 10.0), (0.2, 8.0), (0.4, 20.0), (math.inf, 20.0)]) == pytest.approx(0.1)


def test_histogram_quantile_over_an_exponential_distribution_lands_in_the_right_bucket() -> None:
    """10,000 exact quantiles of Exp(1/0.2 s) in prometheus-client's default buckets: every estimate
    lies in the bucket that holds the true quantile, as linear interpolation guarantees."""
    bounds = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, math.inf]
    n, mean = 10_000, 0.2
    observations = [-mean * math.log(1 - (i + 0.5) / n) for i in range(n)]
    buckets = [(b, float(sum(o <= b for o in observations))) for b in bounds]
    for q in (0.5, 0.9, 0.95, 0.99):
        true = -mean * math.log(1 - q)
        upper = next(b for b in bounds if true <= b)
        lower = max([0.0] + [b for b in bounds if b < upper])
        assert lower <= histogram_quantile(q, buckets) <= upper
    # the median's rank, 5,000, is 1,065 of the 3,200 observations in (0.1, 0.25]: linear interpolation
    # gives 0.15, where the true median is 0.139 (the bucket's shape is not linear)
    below, within = buckets[5][1], buckets[6][1] - buckets[5][1]
    assert (below, within) == (3_935, 3_200)
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1 + 0.15 * (5_000 - below) / within)


def histogram_scrape(t: float, scale: float) -> Scrape:
    """``lat_seconds`` for two routes: route r1 uniform over (0, 1], route r2 all in (1, 2]."""
    lines = ["# TYPE lat_seconds histogram"]
    for route in ("r1", "r2"):
        running = 0.0
        for i in range(1, 21):
            bound = i / 10
            if (bound <= 1) == (route == "r1"):
                running += 10 * scale
            lines.append(f'lat_seconds_bucket{{route="{route}",le="{bound}"}} {running}')
        lines.append(f'lat_seconds_bucket{{route="{route}",le="+Inf"}} {running}')
        lines.append(f'lat_seconds_count{{route="{route}"}} {running}')
        lines.append(f'lat_seconds_sum{{route="{route}"}} {running}')
    return scrape(t, "\n".join(lines))


def test_histogram_quantile_over_bucket_rates_by_route_and_overall() -> None:
    ev = Evaluator([histogram_scrape(0, 0), histogram_scrape(10, 1), histogram_scrape(20, 3)])
    by_route = at(ev, "histogram_quantile(0.5, sum by (le, route) (rate(lat_seconds_bucket[1m])))", 20)
    assert by_route == {(("route", "r1"),): pytest.approx(0.5), (("route", "r2"),): pytest.approx(1.5)}
    overall = at(ev, "histogram_quantile(0.75, sum by (le) (rate(lat_seconds_bucket[1m])))", 20)
    assert overall == {(): pytest.approx(1.5)}
    # no observations in the window: NaN, which the renderer leaves as a gap
    idle = Evaluator([histogram_scrape(0, 1), histogram_scrape(10, 1)])
    (value,) = at(idle, "histogram_quantile(0.5, sum by (le) (rate(lat_seconds_bucket[1m])))", 10).values()
    assert math.isnan(value)


# -- the dashboard JSON --------------------------------------------------------------------


def load_dashboard() -> dict[str, Any]:
    data = orjson.loads(DASHBOARD.read_bytes())
    assert isinstance(data, dict)
    return data


def documented_metrics() -> dict[str, str]:
    """Every metric in the docs' metrics table (its first column; a cell may name several), by type."""
    lines = OBSERVABILITY.read_text().splitlines()
    start = lines.index("| Metric | Type | Labels | What |")
    metrics: dict[str, str] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        for name in re.findall(r"`([a-z_:][a-z0-9_:]*)`", cells[0]):
            metrics[name] = cells[1]
    assert len(metrics) > 20
    return metrics


def queries() -> list[str]:
    return [str(target["expr"]) for _, target in dashboard_queries(load_dashboard())]


def test_every_query_is_in_the_subset_the_renderer_evaluates() -> None:
    exprs = queries()
    assert len(exprs) >= 20
    ev = Evaluator([counters(0, a=0), counters(10, a=1)])
    for expr in exprs:
        ev.query(parse_query(expand(expr, VARIABLES)), 10)  # raises UnsupportedQuery outside the subset


def test_every_query_names_only_metrics_the_docs_list() -> None:
    documented = documented_metrics()
    seen: set[str] = set()
    for expr in queries():
        for name in metric_names(parse_query(expand(expr, VARIABLES))):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if name not in documented:
                assert documented.get(base) == "histogram", f"{name} in {expr!r} is not in docs/observability.md"
            seen.add(base if name not in documented else name)
    assert {"tollway_requests_total", "gen_ai_server_request_duration_seconds", "tollway_cost_usd_total"} <= seen


def test_every_query_filters_on_the_template_variables() -> None:
    for expr in queries():
        assert 'environment=~"$environment"' in expr, expr
    by_alias = [expr for expr in queries() if "$alias" in expr]
    assert len(by_alias) >= 12


def test_the_dashboard_imports_with_a_datasource_input_and_the_two_variables() -> None:
    data = load_dashboard()
    assert data["schemaVersion"] >= 39
    (ds_input,) = data["__inputs"]
    assert ds_input["name"] == "DS_PROMETHEUS"
    assert (ds_input["type"], ds_input["pluginId"]) == ("datasource", "prometheus")
    variables = {var["name"]: var for var in data["templating"]["list"]}
    assert set(variables) == {"environment", "alias"}
    assert variables["environment"]["definition"] == "label_values(tollway_requests_total, environment)"
    assert re.fullmatch(r"label_values\(tollway_requests_total(\{.*\})?, alias\)", variables["alias"]["definition"])
    for var in variables.values():
        assert var["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        assert var["query"]["query"] == var["definition"]
        assert (var["includeAll"], var["multi"], var["allValue"]) == (True, True, ".*")
    for panel, target in dashboard_queries(data):
        assert panel["datasource"]["uid"] == target["datasource"]["uid"] == "${DS_PROMETHEUS}"


def test_panels_fit_the_24_column_grid_without_overlapping() -> None:
    taken: dict[tuple[int, int], str] = {}
    ids = set()
    for panel in load_dashboard()["panels"]:
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, panel["title"]
        assert panel["id"] not in ids
        ids.add(panel["id"])
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in taken, f"{panel['title']} overlaps {taken[(x, y)]}"
                taken[(x, y)] = panel["title"]


# -- drawing ------------------------------------------------------------------------------


def test_render_draws_the_dashboard_and_reports_each_panels_state(tmp_path: Path) -> None:
    body = """
# TYPE tollway_requests counter
tollway_requests_total{{alias="chat-fast-v1",environment="local",status_class="2xx",error_category=""}} {ok}
tollway_requests_total{{alias="",environment="local",status_class="4xx",error_category="model_not_found"}} {bad}
# TYPE tollway_requests_active gauge
tollway_requests_active{{environment="local"}} 0
"""
    scrapes = [scrape(1_700_000_000 + 2 * i, body.format(ok=10 * i, bad=i)) for i in range(10)]
    out = tmp_path / "dashboard.png"
    states = render(load_dashboard(), scrapes, out, notes=["a note"])
    assert out.read_bytes().startswith(PNG_SIGNATURE)
    assert states["Request rate by status class"] == "data"
    assert states["Errors by category (non-2xx)"] == "data"
    assert states["Active requests, streams and queued"] == "zero"
    assert states["Budget rejections by reason"] == "no data"
    assert "Traffic" not in states  # a row is a heading, not a panel


def test_the_banner_reader_takes_the_base_url_and_demo_key_and_keeps_draining() -> None:
    banner = dashboard._Banner()
    copy = io.StringIO()
    text = (
        "Tollway is running\n  base URL : http://127.0.0.1:1/v1\n  demo key : tw-demo-x\nPress Ctrl-C to stop.\nmore\n"
    )
    banner.read(io.StringIO(text), copy)
    assert banner.ready.is_set()
    assert banner.values == {"base URL": "http://127.0.0.1:1/v1", "demo key": "tw-demo-x"}
    assert copy.getvalue() == text
