"""A service account of the test's own and a tiny OAuth2 token endpoint for it, on 127.0.0.1.

``ServiceAccount`` makes an RSA key and writes a service account key file whose ``token_uri`` is a
local ``TokenEndpoint``. The endpoint checks what Google's does of a JWT bearer grant (RFC 7523): the
grant type, the assertion's RS256 signature against the key's public half, its issuer, audience and
scope, and answers an access token with ``expires_in``. Nothing leaves the machine.
"""

from __future__ import annotations

import http.server
import itertools
import json
import threading
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth import jwt

__all__ = ["ServiceAccount", "TokenEndpoint"]

_decode: Callable[..., dict[str, Any]] = jwt.decode

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
"""The ``aud`` google-auth writes into a service account's grant, whatever the key's ``token_uri``."""
EMAIL = "tollway-test@tollway-test-project.iam.gserviceaccount.com"


class TokenEndpoint:
    """``POST /token``: a JWT bearer grant in, ``{"access_token", "expires_in", "token_type"}`` out.
    ``issued`` lists the tokens given, in order; ``fail`` makes it answer 400 ``invalid_grant``.
    ``hold``, when set to an event, keeps each grant waiting until the event is set (at most
    ``hold_timeout_s``); ``holding`` is set while one waits."""

    def __init__(self, public_pem: bytes, expires_in: int = 3600) -> None:
        self.public_pem = public_pem
        self.expires_in = expires_in
        self.issued: list[str] = []
        self.refused: list[str] = []
        self.fail = False
        self.hold: threading.Event | None = None
        self.hold_timeout_s = 10.0
        self.holding = threading.Event()
        self.requests = 0
        """Grants asked for, answered or not."""
        self._counter = itertools.count(1)
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/token"

    def __enter__(self) -> TokenEndpoint:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def grant(self, form: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        self.requests += 1
        if form.get("grant_type") != [JWT_BEARER] or len(form.get("assertion", [])) != 1:
            return 400, {"error": "unsupported_grant_type"}
        try:
            claims = _decode(form["assertion"][0], certs=self.public_pem, audience=GOOGLE_TOKEN_AUDIENCE)
        except ValueError as exc:
            self.refused.append(str(exc))
            return 400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
        if claims.get("iss") != EMAIL or CLOUD_PLATFORM not in str(claims.get("scope", "")).split():
            self.refused.append("claims")
            return 400, {"error": "invalid_scope"}
        if self.fail:
            return 400, {"error": "invalid_grant", "error_description": "account disabled"}
        hold = self.hold
        if hold is not None:
            self.holding.set()
            hold.wait(self.hold_timeout_s)
            self.holding.clear()
        token = f"ya29.test-token-{next(self._counter)}"
        self.issued.append(token)
        return 200, {"access_token": token, "expires_in": self.expires_in, "token_type": "Bearer"}

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                form = urllib.parse.parse_qs(self.rfile.read(length).decode())
                status, doc = endpoint.grant(form) if self.path == "/token" else (404, {"error": "not_found"})
                payload = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler


class ServiceAccount:
    """An RSA key, its token endpoint, and a key file naming both."""

    def __init__(self, folder: Path, expires_in: int = 3600) -> None:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.private_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        public_pem = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.endpoint = TokenEndpoint(public_pem, expires_in)
        self.key_file = folder / "service-account.json"

    def __enter__(self) -> ServiceAccount:
        self.endpoint.__enter__()
        self.key_file.write_text(
            json.dumps(
                {
                    "type": "service_account",
                    "project_id": "tollway-test-project",
                    "private_key_id": "0123456789abcdef",
                    "private_key": self.private_pem,
                    "client_email": EMAIL,
                    "client_id": "100000000000000000001",
                    "token_uri": self.endpoint.url,
                }
            )
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.endpoint.__exit__(*exc)
