"""A cluster's certificates: one CA, and per node a certificate the CA signed.

Layout of a certificate directory (``shardex cluster certs --dir DIR``; a local cluster's is
``<cluster dir>/certs``)::

    ca.pem              the cluster CA's certificate (give it to every node and client)
    ca.key              the CA's private key, mode 0600 (keep it off the nodes if you can:
                        only making certificates needs it)
    nodes/NAME.pem      node NAME's certificate
    nodes/NAME.key      node NAME's private key, mode 0600

Keys are ECDSA P-256 (fast handshakes, small certificates). A node certificate names the
node three ways: its common name, its addresses as subjectAltNames (IPs and DNS names: what
a client's hostname check matches), and a SAN URI ``shardex-node:NAME``, the *node marker*.
A peer whose certificate, signed by this cluster's CA, carries the marker is a node of this
cluster (``shardex.net.tls.peer_node_name``); a certificate without it (or none at all) is
not. Node certificates are good for both ends of a connection (serverAuth and clientAuth):
a node presents the same one when it accepts and when it dials another node.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from shardex.errors import ConfigError

__all__ = [
    "CA_CERT",
    "CA_KEY",
    "LOOPBACK",
    "NODES_DIR",
    "NODE_URI_PREFIX",
    "NodePaths",
    "make_ca",
    "make_cluster_certs",
    "make_node_cert",
    "node_paths",
]

CA_CERT: Final = "ca.pem"
CA_KEY: Final = "ca.key"
NODES_DIR: Final = "nodes"
# The SAN URI scheme that marks a node's certificate (``shardex-node:node1``).
NODE_URI_PREFIX: Final = "shardex-node:"
CA_DAYS: Final = 3650
NODE_DAYS: Final = 825  # what browsers still accept; nodes do not care, operators' tools might
# The addresses a node of a local (one machine) cluster is dialled by.
LOOPBACK: Final = ("127.0.0.1", "::1", "localhost")

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_DNS_RE = re.compile(r"[A-Za-z0-9*]([A-Za-z0-9.-]{0,252})")


class NodePaths:
    """Where node ``name``'s certificate and key live in a certificate directory."""

    __slots__ = ("ca", "cert", "key")

    def __init__(self, cert_dir: Path, name: str) -> None:
        self.ca = cert_dir / CA_CERT
        self.cert = cert_dir / NODES_DIR / f"{name}.pem"
        self.key = cert_dir / NODES_DIR / f"{name}.key"


def node_paths(cert_dir: Path, name: str) -> NodePaths:
    return NodePaths(cert_dir, name)


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ConfigError(
            f"bad node name {name!r} for a certificate",
            details={
                "value": name,
                "hint": "use 1-64 letters, digits, '.', '_' or '-', starting with one of the "
                "first two (the node's configured name)",
            },
        )
    return name


def _write_key(path: Path, key: object) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from shardex.runtime.files import atomic_write_bytes

    assert isinstance(key, ec.EllipticCurvePrivateKey)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    atomic_write_bytes(path, pem, mode=0o600)


def _write_cert(path: Path, cert: object) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from shardex.runtime.files import atomic_write_bytes

    assert isinstance(cert, x509.Certificate)
    atomic_write_bytes(path, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)


def make_ca(cert_dir: Path, *, cluster: str = "shardex", days: int = CA_DAYS) -> Path:
    """Make the cluster CA in ``cert_dir`` unless it is there already; returns ca.pem's path.

    An existing CA is kept: certificates it signed stay valid, and a node added later gets
    its certificate from the same CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    cert_dir.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = cert_dir / CA_CERT, cert_dir / CA_KEY
    if cert_path.exists() and key_path.exists():
        return cert_path
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "shardex"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"{cluster} cluster CA"),
        ]
    )
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))  # tolerate a little clock skew
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    # The key first: a ca.pem without its key would be kept and could sign nothing.
    _write_key(key_path, key)
    _write_cert(cert_path, cert)
    return cert_path


def _san_entries(name: str, addresses: Sequence[str]) -> list[object]:
    from cryptography import x509

    entries: list[x509.GeneralName] = [x509.UniformResourceIdentifier(NODE_URI_PREFIX + name)]
    seen: set[str] = set()
    for raw in addresses:
        addr = raw.strip()
        if not addr or addr in seen:
            continue
        seen.add(addr)
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(addr)))
            continue
        except ValueError:
            pass
        if not _DNS_RE.fullmatch(addr):
            raise ConfigError(
                f"bad certificate address {addr!r}",
                details={
                    "value": addr,
                    "hint": "give IP addresses (10.0.0.5, ::1) or DNS names (db1.example.com), "
                    "without a port",
                },
            )
        entries.append(x509.DNSName(addr))
    return entries


def make_node_cert(
    cert_dir: Path,
    name: str,
    addresses: Sequence[str],
    *,
    days: int = NODE_DAYS,
    not_before: dt.datetime | None = None,
) -> NodePaths:
    """Sign a certificate for node ``name`` with the CA in ``cert_dir`` (``make_ca`` first),
    valid for ``addresses`` (IPs and DNS names the node is dialled by), written to
    ``nodes/NAME.pem`` and ``nodes/NAME.key`` (0600). ``not_before`` and ``days`` exist for
    tests of expired certificates. Replaces an existing certificate of that name."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    _check_name(name)
    if not addresses:
        raise ConfigError(
            f"no address given for node {name}'s certificate",
            details={
                "value": name,
                "hint": "give every IP and DNS name the node is dialled by (--ip, --dns)",
            },
        )
    sans = _san_entries(name, addresses)
    try:
        ca_cert = x509.load_pem_x509_certificate((cert_dir / CA_CERT).read_bytes())
        ca_key = serialization.load_pem_private_key((cert_dir / CA_KEY).read_bytes(), None)
    except FileNotFoundError:
        raise ConfigError(
            f"no cluster CA in {cert_dir}",
            details={
                "value": str(cert_dir),
                "hint": f"make it first: shardex cluster certs --dir {cert_dir} ...",
            },
        ) from None
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "shardex"),
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "node"),
                    x509.NameAttribute(NameOID.COMMON_NAME, name),
                ]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)  # type: ignore[arg-type]
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = NodePaths(cert_dir, name)
    paths.cert.parent.mkdir(parents=True, exist_ok=True)
    _write_key(paths.key, key)
    _write_cert(paths.cert, cert)
    return paths


def make_cluster_certs(cert_dir: Path, nodes: Mapping[str, Sequence[str]]) -> Path:
    """The CA (made unless there) and a certificate for every node of ``nodes`` (name ->
    its addresses) in ``cert_dir``; returns ca.pem's path. What ``shardex cluster certs``
    and a local cluster started with ``--tls`` do."""
    ca = make_ca(cert_dir)
    for name, addresses in nodes.items():
        make_node_cert(cert_dir, name, addresses)
    return ca
