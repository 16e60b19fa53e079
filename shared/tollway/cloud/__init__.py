"""Cloud topology and the embedded local cloud.

- :mod:`tollway.cloud.resources`: the one spec of queues, tables, buckets, secrets and functions;
- :mod:`tollway.cloud.local`: moto server on 127.0.0.1, unless ``AWS_ENDPOINT_URL`` answers;
- :mod:`tollway.cloud.bootstrap`: create the spec on a local cloud, and read it back;
- :mod:`tollway.cloud.runner`: the local event-source runner (SQS mappings, schedules);
- ``python -m tollway.cloud up|bootstrap|describe``.

Not shipped in the Lambda core layer, and never imported by the gateway's request path.
"""
