"""A fleet file: devices whose agents run as services elsewhere (Raspberry Pis) and dial this machine.

With one (`flexfl live --fleet FILE`, `flexfl campaign run --fleet FILE`) a live run starts only its
coordinator here, with the file's [server] table (where it listens, the fleet token, its TLS files),
and waits for the listed devices to join. The agents are the devices' own: provisioned with
`serve_runs` (ansible: edge_agent_serve_runs), they join each run the coordinator starts on that
address and wait for the next one once it finishes, so run after run needs no agent restart.

    devices = ["pi-01", "pi-02", "pi-03"]      # their device ids, in shard order (shard i: devices[i])

    [server]                                    # the coordinator's [server], as in a coordinator file
    listen = "0.0.0.0:50051"                    # the address the agents dial (their `coordinator`)
    fleet_token_file = "ansible/credentials/fleet_token"
    tls_cert = "ansible/credentials/coordinator/fl-coordinator.pem"
    tls_key = "ansible/credentials/coordinator/fl-coordinator.key"
    tls_client_ca = "ansible/credentials/ca/ca.pem"

    [watch]                                     # how this machine asks the coordinator (flexfl status's flags)
    address = "127.0.0.1:50051"
    tls_ca = "ansible/credentials/ca/ca.pem"
    tls_client_cert = "ansible/credentials/devices/pi-01.pem"   # mutual TLS: a device's certificate
    tls_client_key = "ansible/credentials/devices/pi-01.key"

Relative paths are relative to the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from coordinator.config import ServerConfig
from flexfl.config import NOT_IN_FILE, load_config, path_field
from flexfl.errors import ConfigError
from flexfl.proto.channel import TlsFiles


@dataclass(frozen=True)
class WatchConfig:
    """[watch]: where this machine reaches the coordinator for its Status, and with which TLS files."""

    address: str = ""  # HOST:PORT; "" = [server] listen (a wildcard bind reached on loopback)
    tls_ca: str = path_field()
    tls_client_cert: str = path_field()
    tls_client_key: str = path_field()
    tls_server_name: str = ""

    def tls(self) -> TlsFiles | None:
        """The TLS files for Status calls (None: plaintext)."""
        if not self.tls_ca:
            return None
        return TlsFiles(ca=self.tls_ca, client_cert=self.tls_client_cert, client_key=self.tls_client_key,
                        server_name=self.tls_server_name)


@dataclass(frozen=True)
class FleetFile:
    """A fleet of service agents: their device ids, the coordinator's [server] and how to watch it."""

    devices: tuple[str, ...] = ()
    server: ServerConfig = field(default_factory=ServerConfig)
    watch: WatchConfig = field(default_factory=WatchConfig)
    path: str = field(default="", metadata=NOT_IN_FILE)

    def __post_init__(self) -> None:
        if not self.devices or len(set(self.devices)) != len(self.devices):
            raise ConfigError(f"devices must list each device id once (shard i is devices[i]), got "
                              f"{list(self.devices)}")
        if not self.server.fleet_token_file:
            raise ConfigError("[server] fleet_token_file is required: the agents present that fleet token")
        if bool(self.server.tls_cert) != bool(self.watch.tls_ca):
            raise ConfigError("[server] tls_cert and [watch] tls_ca go together: a coordinator with TLS is watched "
                              "over TLS (tls_ca: the CA that signed its certificate)")

    @property
    def watch_address(self) -> str:
        """Where this machine calls the coordinator."""
        from loadgen.harness import connect_address

        return self.watch.address or connect_address(self.server.listen)


def load_fleet_file(path: Path) -> FleetFile:
    """Read and check a fleet file; errors name it."""
    try:
        fleet = load_config(FleetFile, Path(path))
    except ConfigError as exc:
        raise ConfigError(str(exc) if str(path) in str(exc) else f"fleet file {path}: {exc}") from None
    return FleetFile(devices=fleet.devices, server=fleet.server, watch=fleet.watch, path=str(path))
