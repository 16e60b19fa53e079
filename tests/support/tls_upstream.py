"""A TLS provider on 127.0.0.1 for tests: a throwaway CA, and a TLS front for the mock.

``TlsFront`` terminates TLS with a server certificate for ``127.0.0.1`` and ``localhost`` issued
by a CA made for the test, and relays the plain bytes to a local server (the mock provider), so
the mock answers over ``https``. Clients trust it only through ``ThrowawayCa.bundle``::

    ca = ThrowawayCa.create(tmp_path)
    async with MockServer() as mock, TlsFront(ca, mock.base_url) as front:
        ...  # front.base_url == "https://127.0.0.1:<port>"
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from tests.support.connect_proxy import pipe

__all__ = ["ThrowawayCa", "TlsFront"]

_CLOSE_S = 5.0


@dataclass(frozen=True)
class ThrowawayCa:
    bundle: Path
    """The CA's certificate (PEM): what a client's ``caBundle`` names."""
    cert: Path
    """The server's certificate chain (PEM), for 127.0.0.1 and localhost."""
    key: Path

    @classmethod
    def create(cls, folder: Path) -> ThrowawayCa:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        now = datetime.datetime.now(datetime.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Tollway test CA")])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
            .sign(ca_key, hashes.SHA256())
        )
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = [
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.DNSName("localhost"),
        ]
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False)
            .sign(ca_key, hashes.SHA256())
        )
        pem = serialization.Encoding.PEM
        bundle, cert_path, key_path = folder / "ca.pem", folder / "server.pem", folder / "server.key"
        bundle.write_bytes(ca_cert.public_bytes(pem))
        cert_path.write_bytes(cert.public_bytes(pem))
        key_path.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        return cls(bundle, cert_path, key_path)

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        return context

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.bundle))


class TlsFront:
    """TLS on 127.0.0.1 in front of a plain ``http://127.0.0.1:<port>`` server."""

    def __init__(self, ca: ThrowawayCa, upstream: str) -> None:
        self._ca = ca
        self._upstream_port = int(upstream.rsplit(":", 1)[1].split("/")[0])
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0
        self.connections = 0

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            upstream = await asyncio.open_connection("127.0.0.1", self._upstream_port)
            await pipe((reader, writer), upstream)
        except (ConnectionError, ssl.SSLError):
            writer.close()
        except asyncio.CancelledError:
            # Returned from, not raised: asyncio 3.11 logs a stream handler task that ends cancelled.
            writer.close()
        finally:
            self._tasks.discard(task)

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self._ca.server_context())
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()  # the handler ends its tunnel and returns (see ``_serve``)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=_CLOSE_S)
