"""Tollway's CDK app: one stack per stage, built from ``tollway.cloud.resources.topology``.

``python -m infra.app`` is the app (``cdk synth`` runs it through ``infra/cdk.json``);
``python -m infra.deploy`` builds the layers and deploys the stack to AWS or to a local cloud.
"""
