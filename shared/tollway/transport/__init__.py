"""Pooled upstream HTTP clients and the mapping of transport failures to typed errors."""

from tollway.transport.http import ProviderTransport, TransportSettings, UpstreamResponse, map_http_error

__all__ = ["ProviderTransport", "TransportSettings", "UpstreamResponse", "map_http_error"]
