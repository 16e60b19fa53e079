"""Which image URLs a request may pass on to a provider (an alias's ``imageUrlPolicy``).

A provider that fetches image URLs fetches them from its own network. For a cloud provider that
is the provider's business; for a self-hosted one (vLLM, an OpenAI-compatible server inside the
VPC) an unchecked URL makes the gateway a way to reach the cloud's metadata service, loopback
services or private hosts. ``https-public``, the default, therefore refuses any host that is an
address literal outside the public unicast range, in any spelling a URL parser or ``inet_aton``
accepts (``127.1``, ``0x7f000001``, ``2130706433``, ``[::ffff:127.0.0.1]``), and the names that
always mean this host or the metadata service. Host names are not resolved here: a DNS lookup on
the request path would cost a round trip and still race the provider's own lookup, so a name
that resolves to a private address is the provider's fetcher's to refuse.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

__all__ = ["IMAGE_URL_POLICIES", "image_url_error"]

IMAGE_URL_POLICIES = ("data-only", "https-public", "any")

_LOCAL_NAMES = frozenset(
    {
        "localhost",
        "localhost.localdomain",
        "ip6-localhost",
        "ip6-loopback",
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "instance-data",
        "instance-data.ec2.internal",
    }
)
_LOCAL_SUFFIXES = (".localhost", ".local", ".internal", ".localdomain", ".home.arpa")


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` as an IP address if it is one in any accepted spelling, else ``None``."""
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


_GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")
_EMBEDDED_V4 = tuple(
    ipaddress.IPv6Network(n) for n in ("64:ff9b::/96", "64:ff9b:1::/48", "::/96", "::ffff:0:0/96", "::ffff:0:0:0/96")
)
"""IPv6 forms that carry an IPv4 address in their last 32 bits (NAT64, IPv4-compatible, -mapped,
-translated): judged by that address, so ``[64:ff9b::a9fe:a9fe]`` is the metadata service."""


def _public(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(addr, ipaddress.IPv6Address):
        if any(addr in net for net in _EMBEDDED_V4):
            return _public(ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF))
        if addr.sixtofour is not None:
            return _public(addr.sixtofour)
        if addr.teredo is not None or addr not in _GLOBAL_UNICAST_V6:
            return False
    return addr.is_global and not addr.is_multicast


def image_url_error(url: str, policy: str) -> str | None:
    """Why ``url`` may not be sent under ``policy``, or ``None`` when it may."""
    if url.startswith("data:image/"):
        return None
    if policy == "data-only":
        return "must be a data:image URL for this model"
    lowered = url[:8].lower()
    if policy == "any":
        if lowered.startswith(("https://", "http://")):
            return None
        return "must be an http(s) or data:image URL"
    if not lowered.startswith("https://"):
        return "must be an https or data:image URL"
    authority = url[8:].split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    if any(c in authority for c in "\\%") or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in authority):
        # Parsers disagree on these (a WHATWG parser reads "\\" as "/"): refuse rather than guess the host.
        return "has characters in its host part that parsers read differently"
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return "is not a valid URL"
    if not host:
        return "has no host"
    host = host.rstrip(".")
    addr = _address(host)
    if addr is not None:
        return None if _public(addr) else "points at a non-public address"
    if host in _LOCAL_NAMES or host.endswith(_LOCAL_SUFFIXES) or "." not in host:
        return "points at a local or internal host name"
    return None
