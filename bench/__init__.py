"""Tollway's benchmark harness: an open-loop load generator, histograms, profiles and reports.

``python -m bench.run PROFILE`` runs a named profile against the mock provider directly and
through the gateway in one run; ``python -m bench.compare`` guards against regressions.
"""
