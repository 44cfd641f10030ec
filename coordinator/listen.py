"""The coordinator's listening address: checked before the data loads, then bound, with TLS when configured."""

from __future__ import annotations

from pathlib import Path

import grpc

from coordinator.config import CoordinatorConfig, ServerConfig
from flexfl.errors import ConfigError
from flexfl.net import bind_problem


def preflight(cfg: CoordinatorConfig) -> str:
    """Check what would fail after seconds of data loading (token, port, TLS files) now; returns the token."""
    token = cfg.server.token()
    problem = bind_problem(cfg.server.listen)
    if problem:
        raise ConfigError(f"server.listen: cannot bind {cfg.server.listen!r}: {problem}")
    for name in ("tls_cert", "tls_key", "tls_client_ca"):
        if getattr(cfg.server, name):
            _read(getattr(cfg.server, name), what=f"server.{name}")
    return token


async def bind(server: grpc.aio.Server, s: ServerConfig) -> int:
    """Bind `server` to `s.listen` (port 0 picks a free one), over TLS when `s.tls_cert` is set; returns the port.

    A refused address stops the server and raises ConfigError naming the address and why.
    """
    try:
        if s.tls_cert:
            creds = grpc.ssl_server_credentials(
                [(_read(s.tls_key), _read(s.tls_cert))],
                root_certificates=_read(s.tls_client_ca) if s.tls_client_ca else None,
                require_client_auth=bool(s.tls_client_ca),
            )
            port = server.add_secure_port(s.listen, creds)
        else:
            port = server.add_insecure_port(s.listen)
    except RuntimeError:  # grpcio >= 1.6x raises instead of returning 0
        port = 0
    if port == 0:
        await server.stop(None)
        raise ConfigError(f"server.listen: cannot bind {s.listen!r}: "
                          f"{bind_problem(s.listen) or 'gRPC refused the address (see the line above)'}")
    return port


def _read(path: str, *, what: str = "TLS file") -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror}") from None
