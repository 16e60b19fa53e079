"""EventBridge ``rate(...)`` and 6-field ``cron(...)`` expressions, as the local runner reads them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from tollway.cloud.runner import CronSchedule, RateSchedule, parse_schedule


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def occurrences(expression: str, start: datetime, n: int) -> list[datetime]:
    schedule = parse_schedule(expression)
    out, t = [], start
    for _ in range(n):
        t = schedule.next_after(t)
        out.append(t)
    return out


@pytest.mark.parametrize(
    ("expression", "period"),
    [
        ("rate(1 minute)", timedelta(minutes=1)),
        ("rate(5 minutes)", timedelta(minutes=5)),
        ("rate(1 hour)", timedelta(hours=1)),
        ("rate(12 hours)", timedelta(hours=12)),
        ("rate(1 day)", timedelta(days=1)),
        ("rate(7 days)", timedelta(days=7)),
    ],
)
def test_rate_expressions_give_their_period(expression: str, period: timedelta) -> None:
    schedule = parse_schedule(expression)
    assert schedule == RateSchedule(period)
    assert schedule.next_after(at(2030, 1, 1, 0, 0, 30)) == at(2030, 1, 1, 0, 0, 30) + period


@pytest.mark.parametrize(
    "expression",
    [
        "rate(1 minutes)",  # EventBridge: singular for 1
        "rate(2 minute)",  # and plural otherwise
        "rate(0 minutes)",
        "rate(-1 minutes)",
        "rate(5 seconds)",
        "rate(5  minutes)",
        "rate(minutes)",
        "every 5 minutes",
    ],
)
def test_malformed_rates_are_rejected_with_the_expression(expression: str) -> None:
    with pytest.raises(ValueError, match="schedule expression") as err:
        parse_schedule(expression)
    assert expression in str(err.value)


def test_cron_star_fires_every_minute_strictly_after() -> None:
    assert occurrences("cron(* * * * ? *)", at(2030, 1, 1, 0, 0, 0), 3) == [
        at(2030, 1, 1, 0, 1),
        at(2030, 1, 1, 0, 2),
        at(2030, 1, 1, 0, 3),
    ]
    assert parse_schedule("cron(* * * * ? *)").next_after(at(2030, 1, 1, 0, 0, 59)) == at(2030, 1, 1, 0, 1)


def test_cron_numbers_lists_ranges_and_steps() -> None:
    # minutes 0 and 30, hours 8 and 10 (8-10/2), weekdays only; 2030-01-04 is a Friday.
    assert occurrences("cron(0,30 8-10/2 ? * MON-FRI *)", at(2030, 1, 4, 10, 0), 4) == [
        at(2030, 1, 4, 10, 30),
        at(2030, 1, 7, 8, 0),
        at(2030, 1, 7, 8, 30),
        at(2030, 1, 7, 10, 0),
    ]


def test_cron_step_from_a_start_value_runs_to_the_end_of_the_field() -> None:
    assert occurrences("cron(5/20 0 * * ? *)", at(2030, 1, 1, 0, 0), 4) == [
        at(2030, 1, 1, 0, 5),
        at(2030, 1, 1, 0, 25),
        at(2030, 1, 1, 0, 45),
        at(2030, 1, 2, 0, 5),
    ]


def test_cron_day_of_week_counts_from_sunday_as_one() -> None:
    # 1 = SUN in EventBridge: 2030-01-06 is the first Sunday of 2030.
    assert parse_schedule("cron(0 12 ? * 1 *)").next_after(at(2030, 1, 1)) == at(2030, 1, 6, 12, 0)
    assert parse_schedule("cron(0 12 ? * SUN *)") == parse_schedule("cron(0 12 ? * 1 *)")
    assert parse_schedule("cron(0 12 ? * 7 *)").next_after(at(2030, 1, 1)) == at(2030, 1, 5, 12, 0)


def test_cron_day_of_month_month_names_and_years() -> None:
    assert occurrences("cron(15 10 31 * ? *)", at(2030, 1, 31, 10, 15), 2) == [
        at(2030, 3, 31, 10, 15),
        at(2030, 5, 31, 10, 15),
    ]
    assert parse_schedule("cron(0 0 29 FEB ? *)").next_after(at(2030, 1, 1)) == at(2032, 2, 29, 0, 0)
    assert parse_schedule("cron(0 0 1 jan,jul ? 2031-2032)").next_after(at(2030, 6, 1)) == at(2031, 1, 1, 0, 0)
    assert occurrences("cron(0 0 1 1 ? 2031)", at(2030, 1, 1), 1) == [at(2031, 1, 1)]


def test_cron_year_end_and_month_end_roll_over() -> None:
    assert parse_schedule("cron(0 0 * * ? *)").next_after(at(2030, 12, 31, 23, 59)) == at(2031, 1, 1)
    assert parse_schedule("cron(30 23 1 * ? *)").next_after(at(2030, 4, 30, 23, 31)) == at(2030, 5, 1, 23, 30)


def test_cron_reads_other_timezones_as_utc() -> None:
    eastern = timezone(timedelta(hours=-5))
    assert parse_schedule("cron(0 12 * * ? *)").next_after(datetime(2030, 1, 1, 6, 0, tzinfo=eastern)) == at(
        2030, 1, 1, 12, 0
    )


def test_cron_fields_parse_to_sets() -> None:
    cron = parse_schedule("cron(0/15 1,3-5 ? 2-4 MON,WED-FRI 2030)")
    assert isinstance(cron, CronSchedule)
    assert cron.minutes == {0, 15, 30, 45}
    assert cron.hours == {1, 3, 4, 5}
    assert cron.days_of_month is None
    assert cron.months == {2, 3, 4}
    assert cron.days_of_week == frozenset({2, 4, 5, 6})
    assert cron.years == {2030}


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("cron(0 12 * * * *)", "exactly one of day-of-month and day-of-week"),
        ("cron(0 12 ? * ? *)", "exactly one of day-of-month and day-of-week"),
        ("cron(0 12 * *)", "6 fields"),
        ("cron(0 12 * * ? * *)", "6 fields"),
        ("cron(60 12 * * ? *)", "outside 0-59"),
        ("cron(0 24 * * ? *)", "outside 0-23"),
        ("cron(0 0 0 * ? *)", "outside 1-31"),
        ("cron(0 0 ? * 8 *)", "outside 1-7"),
        ("cron(0 0 1 13 ? *)", "outside 1-12"),
        ("cron(0 0 1 * ? 1969)", "outside 1970-2199"),
        ("cron(0 0 L * ? *)", "not supported"),
        ("cron(0 0 ? * 6#3 *)", "not supported"),
        ("cron(0 0 15W * ? *)", "not supported"),
        ("cron(5-1 0 * * ? *)", "runs backwards"),
        ("cron(*/0 0 * * ? *)", "step must be a positive number"),
        ("cron(? 0 * * ? *)", "only allowed in a day field"),
        ("cron(x 0 * * ? *)", "not a value"),
        ("cron(0 0 31 2 ? *)", "no occurrence"),
    ],
)
def test_invalid_crons_say_why(expression: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as err:
        parse_schedule(expression).next_after(at(2030, 1, 1))
    assert expression in str(err.value) or reason == "no occurrence"


def test_a_cron_past_its_last_year_ends() -> None:
    with pytest.raises(ValueError, match="no occurrence"):
        parse_schedule("cron(0 0 1 1 ? 2030)").next_after(at(2030, 6, 1))
