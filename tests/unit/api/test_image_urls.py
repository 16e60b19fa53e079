"""An alias's ``imageUrlPolicy``: which image URLs may reach a provider that might fetch them."""

from __future__ import annotations

import pytest

from tollway.api.image_urls import image_url_error

INLINE = "data:image/png;base64,iVBORw0KGgo="

PRIVATE = [
    "https://127.0.0.1/a.png",
    "https://127.1/a.png",
    "https://2130706433/a.png",
    "https://0x7f.0.0.1/a.png",
    "https://017700000001/a.png",
    "https://10.1.2.3/a.png",
    "https://172.16.0.1/a.png",
    "https://192.168.1.1/a.png",
    "https://169.254.169.254/latest/meta-data/",
    "https://100.64.0.1/a.png",
    "https://0.0.0.0/a.png",
    "https://[::1]/a.png",
    "https://[fd00:ec2::254]/",
    "https://[fe80::1%25eth0]/a.png",
    "https://[::ffff:127.0.0.1]/a.png",
    "https://[::ffff:a9fe:a9fe]/a.png",
    "https://[2002:7f00:1::]/a.png",
    "https://224.0.0.1/a.png",
    "https://user:pw@127.0.0.1:8443/a.png",
    "https://localhost/a.png",
    "https://LOCALHOST./a.png",
    "https://api.localhost/a.png",
    "https://metadata.google.internal/computeMetadata/v1/",
    "https://printer.local/a.png",
    "https://intranet/a.png",
    "https://[64:ff9b::a9fe:a9fe]/",
    "https://[64:ff9b:1::a9fe:a9fe]/",
    "https://[::ffff:0:a9fe:a9fe]/",
    "https://[::7f00:1]/",
    "https://[fec0::1]/",
    "https://[100::1]/",
    "https://127.0.0.1\\@images.example.com/a.png",
    "https://images.example.com\\@127.0.0.1/a.png",
    "https://%31%32%37.0.0.1/a.png",
    "https://127.0.0.1 /a.png",
]


@pytest.mark.parametrize("url", PRIVATE)
def test_https_public_refuses_non_public_hosts(url: str) -> None:
    assert image_url_error(url, "https-public") is not None


@pytest.mark.parametrize(
    "url", ["https://images.example.com/cat.png", "https://8.8.8.8/a.png", "https://[2606:4700::1111]/a.png", INLINE]
)
def test_https_public_allows_public_https_and_inline(url: str) -> None:
    assert image_url_error(url, "https-public") is None


@pytest.mark.parametrize(
    "url", ["http://images.example.com/cat.png", "ftp://x/a.png", "file:///etc/passwd", "gopher://x", "", "https://"]
)
def test_https_public_refuses_other_schemes_and_empty_hosts(url: str) -> None:
    assert image_url_error(url, "https-public") is not None


def test_data_only_allows_only_inline_images() -> None:
    assert image_url_error(INLINE, "data-only") is None
    assert image_url_error("https://images.example.com/cat.png", "data-only") is not None


def test_any_allows_http_and_private_hosts_but_not_other_schemes() -> None:
    assert image_url_error("http://10.0.0.5/a.png", "any") is None
    assert image_url_error("https://127.0.0.1/a.png", "any") is None
    assert image_url_error("file:///etc/passwd", "any") is not None
