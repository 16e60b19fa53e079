"""The gateway's two deployments of the same code, each behind its own Function URL.

*Streaming*: the handler is ``functions/gateway/run.sh``, which the AWS Lambda Web Adapter (a
public layer, referenced by ARN) runs as the function's process; it proxies each invocation to
uvicorn on ``127.0.0.1:8080`` and streams the answer through a RESPONSE_STREAM Function URL.

*Buffered*: the Mangum handler, no adapter, behind a BUFFERED Function URL.

Both URLs use auth NONE because every request carries a Tollway key, which the gateway checks.
Memory, timeout and reserved concurrency are stack parameters, so an operator tunes them at
deploy time without a new synth.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from aws_cdk import Acknowledgment, Aws, CfnCondition, CfnParameter, Duration, Fn, Stack, Token, Validations
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from infra.assets import CONFIG_NAME
from infra.constructs.function import Resources, TollwayFunction
from tollway.cloud.resources import FunctionSpec

__all__ = [
    "ADAPTER_ENVIRONMENT",
    "BUFFERED_HANDLER",
    "DEFAULT_ADAPTER_LAYER_ARN",
    "DEFAULT_RESERVED_CONCURRENCY",
    "Gateway",
    "GatewayParameters",
]

DEFAULT_ADAPTER_LAYER_ARN: Final = "arn:aws:lambda:${AWS::Region}:753240598075:layer:LambdaAdapterLayerX86:25"
"""AWS's public Lambda Web Adapter layer (x86_64); ``${AWS::Region}`` becomes the stack's region."""
BUFFERED_HANDLER: Final = "functions.gateway.handler.handler"
DEFAULT_RESERVED_CONCURRENCY: Final = 100
TASK_ROOT: Final = "/var/task"
ADAPTER_ENVIRONMENT: Final[Mapping[str, str]] = {
    "AWS_LAMBDA_EXEC_WRAPPER": "/opt/bootstrap",
    "AWS_LWA_INVOKE_MODE": "response_stream",
    "AWS_LWA_READINESS_CHECK_PATH": "/healthz",
    "AWS_LWA_PORT": "8080",
    "PORT": "8080",
}
"""The adapter's settings: run.sh listens on ``$PORT``; the adapter waits for ``/healthz``."""
_UNRESERVED: Final = ("0", "-1")


@dataclass(frozen=True, slots=True)
class GatewayParameters:
    """The stack parameters an operator sets at deploy time (``--parameters Name=value``)."""

    memory_size: CfnParameter
    timeout: CfnParameter
    reserved_concurrency: CfnParameter
    buffered_reserved_concurrency: CfnParameter
    adapter_layer_arn: CfnParameter

    @classmethod
    def declare(cls, stack: Stack, spec: FunctionSpec) -> GatewayParameters:
        """Declare the parameters at stack level, so their names stay readable (no path hash)."""
        reserved_doc = "Reserved concurrent executions of the {} gateway; 0 or -1 leaves it unreserved"
        return cls(
            memory_size=CfnParameter(
                stack,
                "GatewayMemorySize",
                type="Number",
                default=spec.memory_mb,
                min_value=128,
                max_value=10240,
                description="Memory (MB) of both gateway deployments",
            ),
            timeout=CfnParameter(
                stack,
                "GatewayTimeout",
                type="Number",
                default=spec.timeout_s,
                min_value=1,
                max_value=900,
                description="Timeout (s) of both gateway deployments: the longest request or stream",
            ),
            reserved_concurrency=CfnParameter(
                stack,
                "GatewayReservedConcurrency",
                type="Number",
                default=DEFAULT_RESERVED_CONCURRENCY,
                min_value=-1,
                description=reserved_doc.format("streaming"),
            ),
            buffered_reserved_concurrency=CfnParameter(
                stack,
                "GatewayBufferedReservedConcurrency",
                type="Number",
                default=0,
                min_value=-1,
                description=reserved_doc.format("buffered"),
            ),
            adapter_layer_arn=CfnParameter(
                stack,
                "LambdaAdapterLayerArn",
                type="String",
                default=DEFAULT_ADAPTER_LAYER_ARN,
                allowed_pattern=r"arn:[a-z-]+:lambda:\S+:\d{12}:layer:[A-Za-z0-9_-]+:\d+",
                description="Lambda Web Adapter layer (x86_64) of the streaming gateway; "
                "the default is AWS's public layer in the stack's region",
            ),
        )

    def reserved(self, parameter: CfnParameter) -> float:
        """The parameter's value, or no ``ReservedConcurrentExecutions`` at all when it is 0 or -1."""
        stack = Stack.of(parameter)
        condition = CfnCondition(
            stack,
            f"{parameter.node.id}IsSet",
            expression=Fn.condition_not(
                Fn.condition_or(*(Fn.condition_equals(parameter.value, v) for v in _UNRESERVED))
            ),
        )
        return Token.as_number(Fn.condition_if(condition.logical_id, parameter.value, Aws.NO_VALUE))

    def adapter_layer(self, scope: Construct) -> lambda_.ILayerVersion:
        """The adapter layer; the default ARN's ``${AWS::Region}`` is substituted, a given ARN used as is."""
        is_default = CfnCondition(
            Stack.of(scope),
            "LambdaAdapterLayerArnIsDefault",
            expression=Fn.condition_equals(self.adapter_layer_arn.value, DEFAULT_ADAPTER_LAYER_ARN),
        )
        arn = Fn.condition_if(is_default.logical_id, Fn.sub(DEFAULT_ADAPTER_LAYER_ARN), self.adapter_layer_arn.value)
        return lambda_.LayerVersion.from_layer_version_arn(scope, "LambdaAdapterLayer", Token.as_string(arn))


class Gateway(Construct):
    """``Streaming`` and ``Buffered`` deployments of the gateway, with a Function URL each."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        spec: FunctionSpec,
        parameters: GatewayParameters,
        code: lambda_.Code,
        layers: Sequence[lambda_.ILayerVersion],
        environment: Mapping[str, str],
        resources: Resources,
        log_retention_days: int,
    ) -> None:
        super().__init__(scope, construct_id)
        self._parameters, self._code = parameters, code
        self._log_retention_days = log_retention_days
        env = {**environment, **dict(spec.environment), "TOLLWAY_CONFIG": f"{TASK_ROOT}/{CONFIG_NAME}"}
        self.streaming = self._deployment(
            "Streaming",
            function_name=spec.name,
            description="Tollway gateway, streaming (Lambda Web Adapter, RESPONSE_STREAM)",
            handler=spec.handler,
            layers=[*layers, parameters.adapter_layer(self)],
            environment={**env, **ADAPTER_ENVIRONMENT},
            reserved=parameters.reserved_concurrency,
        )
        Validations.of(self.streaming.function).acknowledge(
            Acknowledgment(
                id="CloudFormation-Validate::F3031",
                reason="The validator reads the adapter ARN parameter's default literally; the stack "
                "substitutes its ${AWS::Region} (Fn::Sub under LambdaAdapterLayerArnIsDefault)",
            )
        )
        self.buffered_name = f"{spec.name}-buffered"
        self.buffered = self._deployment(
            "Buffered",
            function_name=self.buffered_name,
            description="Tollway gateway, buffered (Mangum)",
            handler=BUFFERED_HANDLER,
            layers=layers,
            environment=env,
            reserved=parameters.buffered_reserved_concurrency,
        )
        for deployment in (self.streaming, self.buffered):
            for grant in spec.grants:
                resources.grant(deployment.function, grant)
        self.streaming_url = self.streaming.function.add_function_url(
            auth_type=lambda_.FunctionUrlAuthType.NONE, invoke_mode=lambda_.InvokeMode.RESPONSE_STREAM
        )
        self.buffered_url = self.buffered.function.add_function_url(
            auth_type=lambda_.FunctionUrlAuthType.NONE, invoke_mode=lambda_.InvokeMode.BUFFERED
        )

    def _deployment(
        self,
        construct_id: str,
        *,
        function_name: str,
        description: str,
        handler: str,
        layers: Sequence[lambda_.ILayerVersion],
        environment: Mapping[str, str],
        reserved: CfnParameter,
    ) -> TollwayFunction:
        return TollwayFunction(
            self,
            construct_id,
            function_name=function_name,
            description=description,
            handler=handler,
            code=self._code,
            layers=layers,
            environment=environment,
            memory_size=self._parameters.memory_size.value_as_number,
            timeout=Duration.seconds(self._parameters.timeout.value_as_number),
            log_retention_days=self._log_retention_days,
            reserved_concurrent_executions=self._parameters.reserved(reserved),
        )
