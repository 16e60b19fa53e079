"""Metrics, traces and logs (docs/observability.md).

A low layer: the request path, the audit trail, routing and governance report into it, and it
imports nothing of theirs. ``metrics`` holds the Prometheus instruments and their cardinality
guard, ``tracing`` builds a traced request's spans when it ends, ``logs`` makes every log line
one JSON object carrying the request and trace ids, and ``emf`` turns the metrics into
CloudWatch embedded-metric documents on Lambda.
"""
