"""Who may connect: a shared token in call metadata, TLS through standard gRPC credentials.

Every stream must present the learner's token (compared in constant time). ``lockstep train`` and
``lockstep learner`` always have one: the configured one (``--token``, ``$LOCKSTEP_TOKEN``), else one
generated for the run (``new_token``), so no other user of the host can say hello, feed data or take
over an actor's session, even on loopback. The token is never written to the run directory; the actors
``lockstep train`` starts receive it with their options (never on a command line), and a generated
token of ``lockstep learner`` is kept for actors of the same user on this host in a file only that user
can read (``publish_token``, read back by ``local_token``). Listening off loopback needs a token given
by the user, since actors on other hosts must be told it.

``diagnose_tls`` tells an actor why its channel cannot come up when the cause is its own TLS settings.
gRPC does not say: a channel only reports TRANSIENT_FAILURE, and the reason ("Socket closed", or an
OpenSSL string) appears in the details of a failed call in wording that changes between gRPC versions;
a plaintext client at a TLS server sees only "Socket closed", as it would for any dropped connection.
So the actor asks the learner's port itself, with Python's ``ssl`` module, whose answers are stable:

1. a TCP connection; if it fails, nothing is listening (yet): not a configuration error, keep retrying;
2. a TLS handshake that verifies nothing: if it fails at the TLS layer, the learner speaks plaintext;
   if it succeeds, the learner speaks TLS, and a plaintext actor is misconfigured;
3. a handshake that verifies the certificate against ``--tls-ca``: if it fails, the CA is the wrong one
   (or the certificate is expired, ...: OpenSSL's reason is quoted);
4. one that also checks the name (``--tls-server-name``, else the host): if it fails, the name is wrong.

Each step runs only when gRPC's own attempt has just failed, so a working actor never probes.
grpc is imported where it is used, so that ``lockstep actor`` can set ``GRPC_VERBOSITY`` before
gRPC's core reads it.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import os
import secrets
import socket
import ssl
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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


def new_token() -> str:
    """A token for one run, when none is configured: 256 random bits."""
    return secrets.token_urlsafe(32)


def token_file(port: int) -> Path:
    """Where ``lockstep learner`` keeps the token it generated, for actors of the same user on this host:
    in ``$XDG_RUNTIME_DIR`` (else ``~/.cache``), in a folder only the user can enter, one file per port."""
    base = os.environ.get("XDG_RUNTIME_DIR") or str(Path.home() / ".cache")
    return Path(base) / "lockstep" / f"token-{port}"


def publish_token(port: int, token: str) -> str:
    """Write ``token`` to ``token_file(port)`` (mode 0600 in a 0700 folder); say where, or why it could not."""
    path = token_file(port)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(token)
    except OSError as err:
        return f"nowhere ({path} cannot be written: {err.strerror}); pass --token to the learner and the actors"
    return f"{path}, where `lockstep actor` of this user on this host finds it"


def unpublish_token(port: int) -> None:
    with contextlib.suppress(OSError):
        token_file(port).unlink()


def local_token(address: str) -> str | None:
    """The token a learner of this user on this host published for ``address`` (loopback only), else None.
    A file that others could read or that another user owns is ignored."""
    try:
        host, port = split_address(address)
    except SecurityError:
        return None
    if not is_loopback(host):
        return None
    path = token_file(int(port))
    try:
        info = path.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            return None
        return path.read_text().strip() or None
    except OSError:
        return None


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
        return (f"this learner requires a token: pass --token to the actor or set {TOKEN_ENV} "
                "(docs/cluster-and-security.md)")
    given = presented[len(SCHEME):] if presented.startswith(SCHEME) else presented
    if not hmac.compare_digest(given.encode(), token.encode()):
        return f"wrong token: pass the learner's token with --token or set {TOKEN_ENV}"
    return None


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise SecurityError(f"cannot read the TLS {what} {path}: {err.strerror}") from err


def server_credentials(cert: str, key: str) -> grpc.ServerCredentials:
    import grpc

    return grpc.ssl_server_credentials([(_read(key, "key"), _read(cert, "certificate"))])


def channel_credentials(ca: str) -> grpc.ChannelCredentials:
    import grpc

    return grpc.ssl_channel_credentials(root_certificates=_read(ca, "CA certificate"))


def diagnose_tls(address: str, tls_ca: str | None, server_name: str | None = None,
                 timeout: float = 3.0) -> str | None:
    """Why an actor with these TLS settings cannot talk to the learner at ``address`` (module docstring),
    naming the flag that fixes it; None when the cause is not the settings or cannot be told."""
    host, port = split_address(address)
    host = host.strip("[]")
    try:
        _handshake(host, int(port), None, None, timeout)
    except _Unreachable:
        return None
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        if tls_ca:
            return (f"the learner at {address} does not speak TLS: drop --tls-ca, or start the learner "
                    f"with --tls-cert and --tls-key")
        return None
    except OSError:  # a timeout mid-handshake: something answers, but not clearly either way
        return None
    if not tls_ca:
        return (f"the learner at {address} speaks TLS: pass --tls-ca CA.pem, the CA certificate "
                f"that signed the learner's --tls-cert")
    try:
        cert = _handshake(host, int(port), tls_ca, None, timeout)
        name = server_name or host
        _handshake(host, int(port), tls_ca, name, timeout)
    except ssl.SSLCertVerificationError as err:
        if err.verify_code != _HOSTNAME_MISMATCH:
            return (f"the learner's TLS certificate at {address} does not verify against --tls-ca {tls_ca} "
                    f"({err.verify_message}): pass --tls-ca with the CA certificate that signed the "
                    f"learner's --tls-cert")
        names = ", ".join(_names(cert)) or "none"
        return (f"the learner's TLS certificate at {address} is not valid for {name!r} (it names: {names}): "
                f"pass --tls-server-name with one of those names")
    except (OSError, _Unreachable):
        return None
    return None


_HOSTNAME_MISMATCH = 62  # OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH


class _Unreachable(Exception):
    """No TCP connection to the address: nobody listens there (yet), or the network is in the way."""


def _handshake(host: str, port: int, ca: str | None, name: str | None, timeout: float) -> dict:
    """One TLS handshake with the learner; returns its verified certificate ({} when ``ca`` is None).
    ``ca``: verify the chain against it; ``name``: also check that the certificate is for ``name``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.set_alpn_protocols(["h2"])  # what gRPC offers
    if ca is None:
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    else:
        context.load_verify_locations(cafile=ca)
        context.check_hostname = name is not None
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as err:
        raise _Unreachable(str(err)) from err
    with sock, context.wrap_socket(sock, server_hostname=name or host) as tls:
        return tls.getpeercert() or {}


def _names(cert: dict) -> list[str]:
    """The names a certificate is valid for: its subjectAltName entries, else its common name."""
    names = [value for kind, value in cert.get("subjectAltName", ()) if kind in ("DNS", "IP Address")]
    if not names:
        names = [value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"]
    return names
