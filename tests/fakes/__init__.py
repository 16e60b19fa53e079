"""Stand-ins for what the gateway talks to, built on its real interfaces: no socket, no server.

``transport.MockTransport`` answers upstream calls from a test's handler, and ``openai_chat``
writes the wire bodies it answers with; ``roots.MockRoots`` publishes real roots from config
dicts whose deployments all send through one ``MockTransport``; ``gateway`` has the request
context, the recording ``sleep`` and the attempt summary of tests that drive ``Gateway``.
"""
