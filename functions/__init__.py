"""Lambda functions: one folder per function, each a thin handler over the tollway library."""
