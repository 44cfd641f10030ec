"""CURVE keys for the loadgen daemon and its clients: make, load, check (ZeroMQ's own format).

A key file is ZeroMQ's certificate format as pyzmq's `zmq.auth` writes and reads it:
`NAME.key` holds the public key (40 Z85 characters), `NAME.key_secret` the public and the
secret key (mode 0600). The daemon's folder (`flexfl loadgen serve --keys DIR`):

    DIR/server.key_secret   the daemon's own keypair (one per daemon host)
    DIR/server.key          its public key: what clients need to reach this daemon
    DIR/clients/*.key       public keys of the clients allowed in (read at start-up)

A client holds its own `NAME.key_secret` and the public `server.key` of each daemon it
drives. `flexfl loadgen keys --out DIR --name NAME` makes a pair; the Ansible credentials
role and the emulated fleet make and place them for you.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.auth
from zmq.utils import z85

from loadgen.errors import LoadgenError

SERVER_NAME = "server"
CLIENTS_DIR = "clients"
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
_KEY_CHARS = 40  # Z85 text of a 32-byte Curve25519 key


class KeyFileError(LoadgenError):
    """A CURVE key file or folder is missing or malformed (the message names the file)."""


@dataclass(frozen=True)
class Keypair:
    public: bytes  # Z85 text, as zmq's curve_* socket options take it
    secret: bytes = field(repr=False)


@dataclass(frozen=True)
class ServerKeys:
    """What a daemon needs: its own keypair and the folder of allowed client keys."""

    keypair: Keypair
    clients_dir: Path
    clients: tuple[bytes, ...]  # the public keys found there


@dataclass(frozen=True)
class ClientAuth:
    """What a client needs: its own keypair and, per daemon endpoint, the daemon's public key."""

    client: Keypair
    server_keys: Mapping[str, bytes]

    def server_key(self, endpoint: str) -> bytes:
        try:
            return self.server_keys[endpoint]
        except KeyError:
            raise KeyFileError(f"no CURVE server key is known for loadgen daemon {endpoint}") from None


def is_local_endpoint(endpoint: str) -> bool:
    """True for endpoints only this machine can reach: ipc://, inproc:// and tcp on loopback."""
    transport, sep, address = endpoint.partition("://")
    if not sep:
        return False
    if transport in ("ipc", "inproc"):
        return True
    if transport != "tcp":
        return False
    host = address.rsplit(":", 1)[0].strip("[]")  # tcp://[::1]:5601 -> ::1
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # "*", an interface name, a host name: may face the network
        return False


def write_keypair(folder: Path, name: str, *, overwrite: bool = False) -> tuple[Path, Path]:
    """Make a keypair as folder/NAME.key and folder/NAME.key_secret (0600); returns both paths.

    Written in a private temporary folder and moved into place, so a reader never sees a
    half-written file and the secret is never readable by others, whatever the umask.
    """
    folder = Path(folder)
    if not name or "/" in name or name.startswith("."):
        raise KeyFileError(f"key name {name!r} must be a plain file name")
    public, secret = folder / f"{name}{PUBLIC_SUFFIX}", folder / f"{name}{SECRET_SUFFIX}"
    if not overwrite and (public.exists() or secret.exists()):
        raise KeyFileError(f"{secret if secret.exists() else public} already exists; "
                           "remove it first (clients and daemons holding the old key must get the new one)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder, prefix=".keys-") as tmp:
            made_public, made_secret = zmq.auth.create_certificates(tmp, name)
            os.chmod(made_secret, 0o600)
            os.chmod(made_public, 0o644)
            os.replace(made_public, public)
            os.replace(made_secret, secret)
    except OSError as exc:
        raise KeyFileError(f"cannot write a keypair in {folder}: {exc.strerror or exc}") from None
    return public, secret


def load_keypair(path: Path) -> Keypair:
    """The keypair in a NAME.key_secret file."""
    public, secret = _load(Path(path))
    if secret is None:
        raise KeyFileError(f"{path}: holds no secret key (a {SECRET_SUFFIX} file made by "
                           "`flexfl loadgen keys` is needed here, not the public .key)")
    return Keypair(public=public, secret=secret)


def load_public_key(path: Path, *, secret_allowed: bool = True) -> bytes:
    """The public key in a NAME.key file (or a NAME.key_secret, where `secret_allowed`)."""
    public, secret = _load(Path(path))
    if secret is not None and not secret_allowed:
        raise KeyFileError(f"{path}: holds a secret key; only public keys (NAME{PUBLIC_SUFFIX}) belong here")
    return public


def load_server_keys(folder: Path) -> ServerKeys:
    """A daemon's keys folder: server.key_secret and at least one clients/*.key."""
    folder = Path(folder)
    if not folder.is_dir():
        raise KeyFileError(f"{folder}: no such keys folder (make one with "
                           f"`flexfl loadgen keys --out {folder} --name {SERVER_NAME}`)")
    secret = folder / f"{SERVER_NAME}{SECRET_SUFFIX}"
    if not secret.exists():
        raise KeyFileError(f"{secret}: missing (make it with `flexfl loadgen keys --out {folder} "
                           f"--name {SERVER_NAME}`)")
    keypair = load_keypair(secret)
    clients_dir = folder / CLIENTS_DIR
    files = sorted(clients_dir.glob(f"*{PUBLIC_SUFFIX}")) if clients_dir.is_dir() else []
    if not files:
        raise KeyFileError(f"{clients_dir}: no client public keys (*{PUBLIC_SUFFIX}); copy there the "
                           f"NAME{PUBLIC_SUFFIX} of every client allowed to drive this daemon")
    clients = tuple(load_public_key(f, secret_allowed=False) for f in files)
    return ServerKeys(keypair=keypair, clients_dir=clients_dir, clients=clients)


def client_auth(client_key: Path, server_keys: Mapping[str, Path]) -> ClientAuth:
    """A client's keypair (NAME.key_secret) and each endpoint's daemon public key file."""
    return ClientAuth(client=load_keypair(client_key),
                      server_keys={endpoint: load_public_key(path) for endpoint, path in server_keys.items()})


def apply_client(sock: zmq.Socket, auth: ClientAuth, endpoint: str) -> None:
    """Make `sock` a CURVE client of the daemon at `endpoint` (before connecting)."""
    sock.curve_serverkey = auth.server_key(endpoint)
    sock.curve_publickey = auth.client.public
    sock.curve_secretkey = auth.client.secret


def apply_server(sock: zmq.Socket, keys: ServerKeys) -> None:
    """Make `sock` a CURVE server (before binding); a ZAP handler decides which clients pass."""
    sock.curve_secretkey = keys.keypair.secret
    sock.curve_publickey = keys.keypair.public
    sock.curve_server = True


def copy_public_key(source: Path, folder: Path, name: str) -> Path:
    """Copy a public key file into folder as NAME.key (e.g. a client key into clients/)."""
    load_public_key(source, secret_allowed=False)  # fail here, not at the daemon's start
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{name}{PUBLIC_SUFFIX}"
    shutil.copyfile(source, target)
    return target


def _load(path: Path) -> tuple[bytes, bytes | None]:
    try:
        public, secret = zmq.auth.load_certificate(path)
    except FileNotFoundError:
        raise KeyFileError(f"{path}: no such key file") from None
    except OSError as exc:
        # pyzmq raises a bare OSError("Invalid certificate file") for a missing file.
        reason = exc.strerror or ("no such key file" if not path.exists() else str(exc))
        raise KeyFileError(f"{path}: {reason}") from None
    except ValueError:
        raise KeyFileError(f"{path}: not a ZeroMQ CURVE key file (no public-key line; "
                           "make one with `flexfl loadgen keys`)") from None
    except UnicodeDecodeError:
        raise KeyFileError(f"{path}: not a ZeroMQ CURVE key file (not text)") from None
    for which, key in (("public-key", public), ("secret-key", secret)):
        if key is not None and not _valid_key(key):
            raise KeyFileError(f"{path}: {which} is not a {_KEY_CHARS}-character Z85 CURVE key")
    return public, secret


def _valid_key(key: bytes) -> bool:
    if len(key) != _KEY_CHARS:
        return False
    try:
        return len(z85.decode(key)) == 32
    except (ValueError, KeyError, IndexError):
        return False
