"""The stack's building blocks, each configured from one spec of the topology."""

from infra.constructs.function import Resources, TollwayFunction
from infra.constructs.gateway import Gateway, GatewayParameters
from infra.constructs.observability import AlarmParameters, Observability
from infra.constructs.storage import QueueWithDlq, bucket, kms_key, table

__all__ = [
    "AlarmParameters",
    "Gateway",
    "GatewayParameters",
    "Observability",
    "QueueWithDlq",
    "Resources",
    "TollwayFunction",
    "bucket",
    "kms_key",
    "table",
]
