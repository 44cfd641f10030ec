"""Which device a caller may act as, from its TLS client certificate (mutual TLS).

With `server.tls_client_ca` set, every agent presents a certificate the fleet CA signed,
and the certificate's subject Common Name (CN) is the one device id it may act as: the id
a call claims in its `x-flexfl-device` metadata must equal the CN exactly (byte for byte,
case-sensitive), else the call is refused with PERMISSION_DENIED.

Why the CN and not a SAN: it is one field, gRPC always exposes it (`x509_common_name` in
the call's auth context), `openssl req -subj /CN=pi-01` and the Ansible credentials role
write it, and a device id needs no encoding to fit in it. Subject alternative names are
not consulted (the role's client certificates carry none). X.509 caps a CN at 64
characters, so a device that authenticates with a certificate has an id of at most 64.
The CA must put one CN in each certificate: gRPC reports the first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from flexfl.errors import IdentityMismatch

# Names of the properties gRPC puts in a call's auth context for a TLS peer.
COMMON_NAME_PROPERTY = "x509_common_name"
TRANSPORT_PROPERTY = "transport_security_type"


def certificate_device(auth_context: Mapping[str, Sequence[bytes]]) -> str | None:
    """The device id a verified client certificate names (its CN), or None without one."""
    names = auth_context.get(COMMON_NAME_PROPERTY) or []
    return names[0].decode("utf-8", "backslashreplace") if names and names[0] else None


def check_claim(auth_context: Mapping[str, Sequence[bytes]], claimed: str) -> None:
    """Raise IdentityMismatch unless the peer's client certificate names device `claimed`."""
    if b"ssl" not in (auth_context.get(TRANSPORT_PROPERTY) or []):
        raise IdentityMismatch(f"a call for device {claimed!r} came without TLS; mutual TLS is required")
    names = auth_context.get(COMMON_NAME_PROPERTY) or []
    if not names or not names[0]:  # gRPC reports an empty CN for a subject without one
        raise IdentityMismatch(f"a call for device {claimed!r} presented a client certificate without a "
                               f"common name; the certificate must name the device (CN={claimed})")
    if names[0] != claimed.encode("utf-8"):  # bytes: no decoding can make two names equal
        raise IdentityMismatch(f"the client certificate names device {certificate_device(auth_context)!r} "
                               f"(its CN) but the call claims device {claimed!r}")
