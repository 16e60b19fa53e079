"""Provider conformance: a versioned suite run against each provider deployment, its stored
results, and the ``requireConformance`` publication policy (docs/conformance.md).

- :mod:`~tollway.conformance.suite`: the cases, :data:`SUITE_VERSION` and :func:`suite_digest`;
- :mod:`~tollway.conformance.runner`: sends the suite through a published deployment's codec and transport;
- :mod:`~tollway.conformance.result`: one (deployment, model) result, its JSON and digest;
- :mod:`~tollway.conformance.store`: results in a directory or under an S3 prefix;
- :mod:`~tollway.conformance.policy`: which routes a configuration may publish, given the results;
- :mod:`~tollway.conformance.commands`: ``tollway conformance run|show`` once the CLI loaded the config.

The package sits below ``tollway.config`` in the layers, so that publication can call the policy;
what it needs of publication (``Publisher``) is handed in by its callers.
"""

from tollway.conformance.policy import (
    check_config,
    check_routes,
    gated_routes,
    load_results,
    pair_capabilities,
    required_capabilities,
)
from tollway.conformance.result import CaseOutcome, ConformanceResult, InvalidResult, parse_result, report_lines
from tollway.conformance.runner import NotServed, Publishes, chat_targets, conformance_config, run_deployment
from tollway.conformance.store import (
    ConformanceStoreError,
    DirectoryStore,
    ResultStore,
    S3Store,
    open_store,
    results_location,
)
from tollway.conformance.suite import CAPABILITIES, CASES, SUITE_VERSION, suite_digest

__all__ = [
    "CAPABILITIES",
    "CASES",
    "SUITE_VERSION",
    "CaseOutcome",
    "ConformanceResult",
    "ConformanceStoreError",
    "DirectoryStore",
    "InvalidResult",
    "NotServed",
    "Publishes",
    "ResultStore",
    "S3Store",
    "chat_targets",
    "check_config",
    "check_routes",
    "conformance_config",
    "gated_routes",
    "load_results",
    "open_store",
    "pair_capabilities",
    "parse_result",
    "report_lines",
    "required_capabilities",
    "results_location",
    "run_deployment",
    "suite_digest",
]
