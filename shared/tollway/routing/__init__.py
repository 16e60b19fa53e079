"""Alias plans, attempt order, and per-deployment health that survives reloads."""

from tollway.routing.health import CircuitPolicy, DeploymentHealth, HealthRegistry
from tollway.routing.plan import AliasPlan, Deployment, RetryPolicy, RouteTarget

__all__ = [
    "AliasPlan",
    "CircuitPolicy",
    "Deployment",
    "DeploymentHealth",
    "HealthRegistry",
    "RetryPolicy",
    "RouteTarget",
]
