"""A gRPC channel to a coordinator, in plaintext, TLS or mutual TLS: the agent's and every other caller's.

TLS is on when a CA file is given (the CA that signed the coordinator's certificate); mutual TLS
when a client certificate and key are given too, whose common name (CN) is the one device id the
caller may claim (coordinator/identity.py). Channel options (message sizes, keepalive) are the
fleet's (proto/options.py).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flexfl.errors import ConfigError

if TYPE_CHECKING:  # imported where a channel is opened: configs name TlsFiles, and `flexfl --help` needs no gRPC
    import grpc


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for a TLS channel (the agent config's tls_* keys)."""

    ca: str  # the CA that signed the coordinator's certificate
    client_cert: str = ""  # mutual TLS: this caller's certificate (its CN is the device id it may claim)
    client_key: str = ""
    server_name: str = ""  # override the name checked in the coordinator's certificate


def open_channel(address: str, tls: TlsFiles | None) -> grpc.Channel:
    """A channel to `address` (HOST:PORT): plaintext without `tls`; a ConfigError when a file cannot be read."""
    import grpc
    from flexfl.proto.options import GRPC_OPTIONS

    options: list[tuple[str, int | str]] = list(GRPC_OPTIONS)
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    creds = grpc.ssl_channel_credentials(
        root_certificates=read_pem(tls.ca, what="tls_ca"),
        private_key=read_pem(tls.client_key, what="tls_client_key") if tls.client_key else None,
        certificate_chain=read_pem(tls.client_cert, what="tls_client_cert") if tls.client_cert else None,
    )
    return grpc.secure_channel(address, creds, options=options)


def read_pem(path: str, *, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror}") from None


def certificate_common_name(path: str) -> str | None:
    """The subject CN of the PEM certificate at `path` (None: it has none, or it cannot be read as one).

    Read with the standard library's X.509 decoder (ssl._ssl._test_decode_cert, CPython's
    own, present since 3.2): FlexFL does not depend on `cryptography`, and the CN is all it needs.
    """
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    if decode is None:
        return None
    try:
        subject = decode(path).get("subject", ())
    except (OSError, ssl.SSLError, ValueError):
        return None
    names = [value for rdn in subject for key, value in rdn if key == "commonName"]
    return names[0] if names else None
