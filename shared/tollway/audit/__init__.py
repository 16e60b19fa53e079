"""The audit pipeline: metadata-only events, the write-ahead log, the shipper and the sink."""
