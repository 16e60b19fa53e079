"""The conformance function: the provider conformance suite against the configured deployments, on a schedule."""
