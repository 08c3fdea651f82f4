"""Who may connect: a shared token in call metadata, TLS through standard gRPC credentials.

The learner listens on loopback by default. Listening on any other address needs
a token, which every stream must present (compared in constant time).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from pathlib import Path

import grpc

TOKEN_ENV = "LOCKSTEP_TOKEN"
METADATA_KEY = "authorization"
SCHEME = "Bearer "


class SecurityError(ValueError):
    """A configuration that would expose the learner, or credentials that cannot be loaded."""


def token_from(flag: str | None) -> str | None:
    """The token from a flag, else from $LOCKSTEP_TOKEN, else None."""
    token = flag if flag else os.environ.get(TOKEN_ENV, "")
    return token or None


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name that is not localhost may resolve anywhere


def split_address(address: str) -> tuple[str, str]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise SecurityError(f"address {address!r} is not host:port")
    return host, port


def check_listen(address: str, token: str | None) -> None:
    host, _ = split_address(address)
    if not is_loopback(host) and not token:
        raise SecurityError(
            f"refusing to listen on {address} without a token: anyone who can reach it could feed the learner. "
            f"Pass --token or set {TOKEN_ENV} (and consider --tls-cert/--tls-key), or listen on 127.0.0.1"
        )


def check_server(address: str, token: str | None, tls_cert: str | None = None, tls_key: str | None = None) -> None:
    """Refuse a server configuration that is unsafe or incomplete, before anything starts."""
    check_listen(address, token)
    if bool(tls_cert) != bool(tls_key):
        raise SecurityError("TLS needs both --tls-cert and --tls-key")


def metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return ((METADATA_KEY, SCHEME + token),) if token else ()


def authorized(invocation_metadata, token: str) -> str | None:
    """None if the call carries ``token``; otherwise why not."""
    presented = None
    for key, value in invocation_metadata or ():
        if key == METADATA_KEY:
            presented = value
    if presented is None:
        return f"this learner requires a token: pass --token to the actor or set {TOKEN_ENV}"
    given = presented[len(SCHEME):] if presented.startswith(SCHEME) else presented
    if not hmac.compare_digest(given.encode(), token.encode()):
        return "wrong token"
    return None


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise SecurityError(f"cannot read the TLS {what} {path}: {err.strerror}") from err


def server_credentials(cert: str, key: str) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(_read(key, "key"), _read(cert, "certificate"))])


def channel_credentials(ca: str) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=_read(ca, "CA certificate"))
