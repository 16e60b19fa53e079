"""The stage's CloudWatch alarms and its dashboard.

What is watched, and from where:

- **Gateway 5xx share**: metric math over the EMF metric ``tollway_requests_total`` that both
  gateway deployments print (``tollway.telemetry.emf``), in its ``environment`` and
  ``environment`` + ``status_class`` roll-ups: ``100 * 5xx / all`` over five minutes, counted only
  once the five minutes hold :data:`MIN_REQUESTS` requests, so that one failure of two requests
  does not page anyone. Lambda's own ``Errors`` would miss it: a 502 from a failing provider is
  an ordinary response, not a failed invocation.
- **Dead-letter queues**: any visible message (``ApproximateNumberOfMessagesVisible`` > 0), one
  alarm per queue.
- **Throttles**: Lambda's ``Throttles`` > 0 of every function, both gateway deployments included.
- **Pricing refresh**: ``tollway_pricing_refresh_failed`` (a run that raised or whose sources were
  rejected) plus the function's ``Errors`` (a run that never got to print, a timeout) >= 1 over
  one schedule period, so the alarm describes the last run.
- **Audit lag**: the audit queue's ``ApproximateAgeOfOldestMessage`` above the
  ``AuditLagThresholdSeconds`` parameter.

Every alarm treats missing data as not breaching: no traffic, no run and an idle queue publish
nothing, and none of them is a fault. The ``AlarmTopicArn`` parameter, when set, is every alarm's
ALARM and OK action; empty (the default), the alarms only change state.

The gateway's metrics carry the ``environment`` its config names (``telemetry.environment``), and
the alarms and dashboard read the stage's name there: the config deployed to a stage sets
``environment: ${TOLLWAY_ENVIRONMENT:local}`` (the stack sets ``TOLLWAY_ENVIRONMENT``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, cast

from aws_cdk import Acknowledgment, Aws, CfnCondition, CfnParameter, Duration, Fn, Stack, Validations
from aws_cdk import aws_cloudwatch as cloudwatch
from constructs import Construct

from infra.constructs.function import TollwayFunction
from infra.constructs.storage import QueueWithDlq, construct_id
from tollway.cloud.resources import FunctionSpec, Topology
from tollway.cloud.runner import parse_schedule
from tollway.telemetry.emf import NAMESPACE

__all__ = [
    "AUDIT_BATCH_FAILURES",
    "AUDIT_EVENTS_WRITTEN",
    "AUDIT_QUEUE",
    "DEFAULT_AUDIT_LAG_S",
    "DEFAULT_ERROR_RATE_PERCENT",
    "ESTIMATED_COST",
    "GATEWAY_DURATION",
    "GATEWAY_OVERHEAD",
    "GATEWAY_REQUESTS",
    "GATEWAY_TOKENS",
    "GATEWAY_TTFT",
    "MIN_REQUESTS",
    "NAMESPACE",
    "PRICING_FUNCTION",
    "PRICING_REFRESH_FAILED",
    "PRICING_REFRESH_SUCCEEDED",
    "RECONCILED_COST",
    "USAGE_BATCH_FAILURES",
    "USAGE_RECORDS_RECONCILED",
    "AlarmParameters",
    "Observability",
    "schedule_period",
]

# The gateway's EMF metrics: its Prometheus sample names (tollway.telemetry.metrics).
GATEWAY_REQUESTS: Final = "tollway_requests_total"
GATEWAY_OVERHEAD: Final = "tollway_gateway_overhead_seconds"
GATEWAY_DURATION: Final = "gen_ai_server_request_duration_seconds"
GATEWAY_TTFT: Final = "gen_ai_server_time_to_first_token_seconds"
GATEWAY_TOKENS: Final = "tollway_tokens_total"
ESTIMATED_COST: Final = "tollway_cost_usd_total"
# The workers' Powertools metrics (functions/*/handler.py; a test holds the names together).
AUDIT_EVENTS_WRITTEN: Final = "tollway_audit_events_written"
AUDIT_BATCH_FAILURES: Final = "tollway_audit_batch_failures"
USAGE_RECORDS_RECONCILED: Final = "tollway_usage_records_reconciled"
USAGE_BATCH_FAILURES: Final = "tollway_usage_batch_failures"
RECONCILED_COST: Final = ESTIMATED_COST
"""The usage reconciler adds to the gateway's cost metric, with ``kind=reconciled``."""
PRICING_REFRESH_SUCCEEDED: Final = "tollway_pricing_refresh_succeeded"
PRICING_REFRESH_FAILED: Final = "tollway_pricing_refresh_failed"
CONFORMANCE_FAILED: Final = "tollway_conformance_failed"

AUDIT_QUEUE: Final = "audit"
"""The queue whose age is the audit lag (a :class:`~tollway.cloud.resources.QueueSpec` key)."""
PRICING_FUNCTION: Final = "pricing-refresh"
"""The scheduled function whose failures alarm (a :class:`~tollway.cloud.resources.FunctionSpec` key)."""
CONFORMANCE_FUNCTION: Final = "conformance"
"""The opt-in scheduled conformance run, whose failed runs alarm when the stage has it."""
DEFAULT_AUDIT_LAG_S: Final = 300
DEFAULT_ERROR_RATE_PERCENT: Final = 5
MIN_REQUESTS: Final = 20
"""Requests in five minutes below which the 5xx share counts as 0."""
ALARM_PERIOD: Final = Duration.minutes(5)
GRAPH_PERIOD: Final = Duration.minutes(1)
_PERCENTILES: Final = ("p50", "p90", "p99")


def schedule_period(expression: str) -> Duration:
    """The time between two runs of an EventBridge schedule, as an alarm period.

    A ``rate`` is its own period; a ``cron`` is measured between two consecutive occurrences.
    CloudWatch wants a whole number of minutes, and an alarm looks back one day at most.
    """
    schedule = parse_schedule(expression)
    start = schedule.next_after(datetime(2030, 1, 1, tzinfo=UTC))
    seconds = (schedule.next_after(start) - start).total_seconds()
    minutes = min(max(1, -(-int(seconds) // 60)), 24 * 60)
    return Duration.minutes(minutes)


@dataclass(frozen=True, slots=True)
class AlarmParameters:
    """The stack parameters of the alarms (``--parameters Name=value`` at deploy time)."""

    topic_arn: CfnParameter
    audit_lag_s: CfnParameter
    error_rate_percent: CfnParameter

    @classmethod
    def declare(cls, stack: Stack) -> AlarmParameters:
        """Declared at stack level, so their names stay readable (no path hash)."""
        return cls(
            topic_arn=CfnParameter(
                stack,
                "AlarmTopicArn",
                type="String",
                default="",
                allowed_pattern=r"^$|^arn:[a-z-]+:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_.-]+$",
                description="SNS topic notified when an alarm changes state (ALARM and OK); empty: no notification",
            ),
            audit_lag_s=CfnParameter(
                stack,
                "AuditLagThresholdSeconds",
                type="Number",
                default=DEFAULT_AUDIT_LAG_S,
                min_value=60,
                max_value=1_209_600,
                description="Age (s) of the audit queue's oldest message above which the audit-lag alarm fires",
            ),
            error_rate_percent=CfnParameter(
                stack,
                "GatewayErrorRateThresholdPercent",
                type="Number",
                default=DEFAULT_ERROR_RATE_PERCENT,
                min_value=0,
                max_value=100,
                description="Share (%) of 5xx answers over five minutes above which the gateway alarm fires",
            ),
        )


class Observability(Construct):
    """Every alarm of the stage (:attr:`alarms`) and its dashboard (:attr:`dashboard`, named after the stage).

    ``gateway_functions`` are the gateway's deployments by function name; ``workers`` the worker
    functions by spec key, so the pricing refresh is found by :data:`PRICING_FUNCTION`.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id_: str,
        *,
        topology: Topology,
        gateway_functions: Sequence[tuple[str, TollwayFunction]],
        workers: Mapping[str, TollwayFunction],
        queues: Mapping[str, QueueWithDlq],
        parameters: AlarmParameters,
    ) -> None:
        super().__init__(scope, construct_id_)
        self._stage = topology.prefix
        self._parameters = parameters
        self.functions: list[tuple[str, TollwayFunction]] = [
            *gateway_functions,
            *((topology.function(key).name, fn) for key, fn in workers.items()),
        ]
        self.alarms: list[cloudwatch.Alarm] = []
        self.alarm_names: list[str] = []
        self._gateway_alarm()
        for key, queue in queues.items():
            self._dlq_alarm(key, queue)
        for name, fn in self.functions:
            self._throttle_alarm(name, fn)
        pricing = workers.get(PRICING_FUNCTION)
        if pricing is not None:
            self._pricing_alarm(topology.function(PRICING_FUNCTION), pricing)
        conformance = workers.get(CONFORMANCE_FUNCTION)
        if conformance is not None:
            self._conformance_alarm(topology.function(CONFORMANCE_FUNCTION), conformance)
        audit = queues.get(AUDIT_QUEUE)
        if audit is not None:
            self._audit_lag_alarm(audit)
        self._actions()
        self.dashboard = self._dashboard(queues, audit)

    # ------------------------------------------------------------------ metrics

    def _tollway(
        self,
        name: str,
        *,
        statistic: str = "Sum",
        period: Duration = GRAPH_PERIOD,
        label: str | None = None,
        **dims: str,
    ) -> cloudwatch.Metric:
        """A metric of the ``Tollway`` namespace in this stage's ``environment`` (plus ``dims``)."""
        return cloudwatch.Metric(
            namespace=NAMESPACE,
            metric_name=name,
            dimensions_map={"environment": self._stage, **dims},
            statistic=statistic,
            period=period,
            label=label,
        )

    def _error_rate(self, period: Duration) -> cloudwatch.MathExpression:
        return cloudwatch.MathExpression(
            expression=f"IF(requests >= {MIN_REQUESTS}, 100 * FILL(errors, 0) / requests, 0)",
            using_metrics={
                "requests": self._tollway(GATEWAY_REQUESTS, period=period),
                "errors": self._tollway(GATEWAY_REQUESTS, period=period, status_class="5xx"),
            },
            label="5xx share (%)",
            period=period,
        )

    # ------------------------------------------------------------------ alarms

    def _alarm(
        self,
        construct_id_: str,
        name: str,
        description: str,
        metric: cloudwatch.IMetric,
        threshold: float,
        comparison: cloudwatch.ComparisonOperator = cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
    ) -> cloudwatch.Alarm:
        self.alarm_names.append(name)
        alarm = cloudwatch.Alarm(
            self,
            construct_id_,
            alarm_name=name,
            alarm_description=description,
            metric=metric,
            threshold=threshold,
            comparison_operator=comparison,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        self.alarms.append(alarm)
        return alarm

    def _gateway_alarm(self) -> None:
        self._alarm(
            "GatewayErrorRateAlarm",
            f"{self._stage}-gateway-5xx-rate",
            f"The share of 5xx answers of the gateway (both deployments) over five minutes, once there are "
            f"{MIN_REQUESTS} requests, is above GatewayErrorRateThresholdPercent.",
            self._error_rate(ALARM_PERIOD),
            self._parameters.error_rate_percent.value_as_number,
        )

    def _dlq_alarm(self, key: str, queue: QueueWithDlq) -> None:
        self._alarm(
            construct_id(key, "DeadLetterQueueAlarm"),
            f"{queue.spec.dlq_name}-not-empty",
            f"Messages that failed {queue.spec.max_receive_count} times reached {queue.spec.dlq_name}: "
            "inspect them, fix the cause, then redrive them to the queue.",
            queue.dead_letter_queue.metric_approximate_number_of_messages_visible(
                period=ALARM_PERIOD, statistic="Maximum"
            ),
            0,
        )

    def _throttle_alarm(self, name: str, fn: TollwayFunction) -> None:
        self._alarm(
            construct_id(name.removeprefix(f"{self._stage}-"), "ThrottleAlarm"),
            f"{name}-throttled",
            f"Lambda throttled invocations of {name}: reserved or account concurrency is exhausted.",
            fn.function.metric_throttles(period=ALARM_PERIOD, statistic="Sum"),
            0,
        )

    def _failed_runs(self, spec: FunctionSpec, fn: TollwayFunction, metric: str) -> cloudwatch.MathExpression:
        """A scheduled function's runs that reported ``metric`` or raised, over its schedule's period."""
        period = schedule_period(spec.schedules[0].expression) if spec.schedules else Duration.hours(1)
        return cloudwatch.MathExpression(
            expression="FILL(failed, 0) + FILL(errors, 0)",
            using_metrics={
                "failed": self._tollway(metric, period=period),
                "errors": fn.function.metric_errors(period=period, statistic="Sum"),
            },
            label="failed runs",
            period=period,
        )

    def _pricing_alarm(self, spec: FunctionSpec, fn: TollwayFunction) -> None:
        self._alarm(
            "PricingRefreshFailedAlarm",
            f"{spec.name}-failed",
            f"A run of {spec.name} raised, timed out or rejected its sources: the pricing snapshot did "
            "not follow them (the last valid one stays current). Its log says which source and why.",
            self._failed_runs(spec, fn, PRICING_REFRESH_FAILED),
            1,
            cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        )

    def _conformance_alarm(self, spec: FunctionSpec, fn: TollwayFunction) -> None:
        self._alarm(
            "ConformanceFailedAlarm",
            f"{spec.name}-failed",
            f"A run of {spec.name} raised, or a deployment did not pass a capability its routes declare "
            "(or could not be tested). Its log and the stored results say which deployment and case.",
            self._failed_runs(spec, fn, CONFORMANCE_FAILED),
            1,
            cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        )

    def _audit_lag_alarm(self, audit: QueueWithDlq) -> None:
        self._alarm(
            "AuditLagAlarm",
            f"{audit.spec.name}-lag",
            f"The oldest message on {audit.spec.name} is older than AuditLagThresholdSeconds: the audit "
            "writer is behind, failing or not running, and the audit trail is late.",
            audit.queue.metric_approximate_age_of_oldest_message(period=ALARM_PERIOD, statistic="Maximum"),
            self._parameters.audit_lag_s.value_as_number,
        )

    def _actions(self) -> None:
        """Point every alarm's ALARM and OK actions at ``AlarmTopicArn``, or at nothing when it is empty."""
        topic = self._parameters.topic_arn.value_as_string
        has_topic = CfnCondition(
            Stack.of(self),
            "AlarmTopicArnIsSet",
            expression=Fn.condition_not(Fn.condition_equals(topic, "")),
        )
        actions = Fn.condition_if(has_topic.logical_id, [topic], Aws.NO_VALUE)
        for alarm in self.alarms:
            cfn = cast(cloudwatch.CfnAlarm, alarm.node.default_child)
            cfn.add_property_override("AlarmActions", actions)
            cfn.add_property_override("OKActions", actions)
            Validations.of(cfn).acknowledge(
                Acknowledgment(
                    id="CloudFormation-Validate::F3033",
                    reason="The validator puts the AlarmTopicArn parameter's empty default into the "
                    "AlarmTopicArnIsSet branch, which the condition only takes when it is not empty",
                )
            )

    # ------------------------------------------------------------------ dashboard

    def _dashboard(self, queues: Mapping[str, QueueWithDlq], audit: QueueWithDlq | None) -> cloudwatch.Dashboard:
        dashboard = cloudwatch.Dashboard(
            self, "Dashboard", dashboard_name=self._stage, default_interval=Duration.hours(3)
        )
        # By name, not by reference: an emulator without alarms (moto) still creates the dashboard.
        by_name = [cloudwatch.Alarm.from_alarm_name(self, f"AlarmRef{i}", n) for i, n in enumerate(self.alarm_names)]
        dashboard.add_widgets(cloudwatch.AlarmStatusWidget(alarms=by_name, title="Alarms", width=24, height=4))
        dashboard.add_widgets(*self._request_widgets())
        dashboard.add_widgets(
            *(
                self._percentiles(title, name)
                for title, name in (
                    ("Gateway overhead (s)", GATEWAY_OVERHEAD),
                    ("Request duration (s)", GATEWAY_DURATION),
                    ("Time to first token (s)", GATEWAY_TTFT),
                )
            )
        )
        dashboard.add_widgets(*self._usage_widgets())
        dashboard.add_widgets(*self._queue_widgets(queues, audit))
        dashboard.add_widgets(*self._function_widgets())
        return dashboard

    def _request_widgets(self) -> list[cloudwatch.IWidget]:
        by_class = [self._tollway(GATEWAY_REQUESTS, status_class=c, label=c) for c in ("2xx", "4xx", "5xx")]
        errors = cloudwatch.MathExpression(
            expression=(
                f'SEARCH(\'{{{NAMESPACE},environment,error_category}} MetricName="{GATEWAY_REQUESTS}" '
                f"environment=\"{self._stage}\"', 'Sum', {int(GRAPH_PERIOD.to_seconds())})"
            ),
            label="${PROP('Dim.error_category')}",
            period=GRAPH_PERIOD,
        )
        return [
            cloudwatch.GraphWidget(
                title="Requests by status class",
                left=by_class,
                right=[self._error_rate(GRAPH_PERIOD)],
                right_y_axis=cloudwatch.YAxisProps(min=0, max=100, label="%", show_units=False),
                stacked=False,
                width=12,
            ),
            cloudwatch.GraphWidget(title="Errors by code", left=[errors], width=12),
        ]

    def _percentiles(self, title: str, name: str) -> cloudwatch.GraphWidget:
        return cloudwatch.GraphWidget(
            title=title,
            left=[self._tollway(name, statistic=p, label=p) for p in _PERCENTILES],
            width=8,
        )

    def _usage_widgets(self) -> list[cloudwatch.IWidget]:
        return [
            cloudwatch.GraphWidget(
                title="Tokens",
                left=[
                    self._tollway(GATEWAY_TOKENS, type=t, label=t) for t in ("input", "output", "cached", "reasoning")
                ],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Cost (USD)",
                left=[
                    self._tollway(ESTIMATED_COST, kind="estimated", label="estimated by the gateway"),
                    self._tollway(RECONCILED_COST, kind="reconciled", label="reconciled into the ledger"),
                ],
                width=12,
            ),
        ]

    def _queue_widgets(
        self, queues: Mapping[str, QueueWithDlq], audit: QueueWithDlq | None
    ) -> list[cloudwatch.IWidget]:
        widgets: list[cloudwatch.IWidget] = [
            cloudwatch.GraphWidget(
                title="Dead-letter queues (visible messages)",
                left=[
                    q.dead_letter_queue.metric_approximate_number_of_messages_visible(
                        period=GRAPH_PERIOD, statistic="Maximum", label=q.spec.dlq_name
                    )
                    for q in queues.values()
                ],
                width=8,
            )
        ]
        if audit is not None:
            widgets.append(
                cloudwatch.GraphWidget(
                    title="Audit queue: oldest message (s)",
                    left=[
                        audit.queue.metric_approximate_age_of_oldest_message(
                            period=GRAPH_PERIOD, statistic="Maximum", label=audit.spec.name
                        )
                    ],
                    left_annotations=[
                        cloudwatch.HorizontalAnnotation(
                            value=self._parameters.audit_lag_s.value_as_number, label="alarm threshold"
                        )
                    ],
                    width=8,
                )
            )
        widgets.append(
            cloudwatch.GraphWidget(
                title="Workers",
                left=[
                    self._tollway(AUDIT_EVENTS_WRITTEN, label="audit events written"),
                    self._tollway(USAGE_RECORDS_RECONCILED, label="usage records reconciled"),
                ],
                right=[
                    self._tollway(AUDIT_BATCH_FAILURES, label="audit messages failed"),
                    self._tollway(USAGE_BATCH_FAILURES, label="usage messages failed"),
                    self._tollway(PRICING_REFRESH_FAILED, label="pricing refreshes failed"),
                ],
                width=8,
            )
        )
        return widgets

    def _function_widgets(self) -> list[cloudwatch.IWidget]:
        def each(statistic: str, metric: str) -> list[cloudwatch.IMetric]:
            return [
                fn.function.metric(metric, period=GRAPH_PERIOD, statistic=statistic, label=name)
                for name, fn in self.functions
            ]

        return [
            cloudwatch.GraphWidget(title="Function errors", left=each("Sum", "Errors"), width=8),
            cloudwatch.GraphWidget(title="Function throttles", left=each("Sum", "Throttles"), width=8),
            cloudwatch.GraphWidget(title="Function duration p99 (ms)", left=each("p99", "Duration"), width=8),
        ]
