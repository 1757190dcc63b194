"""TLS for the TCP transport: the contexts, the peer's node name, and clear failures.

A ``TlsConfig`` is what a ``TcpTransport`` (and the blocking sockets that share its
settings) is given: the cluster CA, and for a node its own certificate and key
(``shardex.net.certs`` makes them). From it:

- the server side (a node's listener) requires TLS 1.3, presents the node's certificate and
  verifies a client certificate when one is presented (``CERT_OPTIONAL``): nodes present
  theirs, so node-to-node connections are mutually authenticated; a user's client presents
  none and still connects;
- the client side requires TLS 1.3, verifies the server's certificate against the cluster
  CA and its subjectAltNames against the address dialled (an IP or a DNS name), and
  presents the node's certificate when it has one.

What TLS proves about the peer is on the comm: ``Comm.peer_node`` is the node name of a
verified certificate that carries the cluster's node marker (``certs.NODE_URI_PREFIX``),
else None. Authentication above the transport decides what that name may do.

Encryption stays below the frames: the RPC handshake (``net/auth.py``) and everything above
it run unchanged over a TLS comm.
"""

from __future__ import annotations

import dataclasses
import ssl
from pathlib import Path
from typing import Any, Final

from shardex.errors import AuthFailed, ConfigError, NodeUnavailable, ShardexError
from shardex.net.certs import NODE_URI_PREFIX, node_paths

__all__ = [
    "REFUSAL_HINT",
    "SNIFF_TIMEOUT",
    "TLS_RECORD_HANDSHAKE",
    "TlsConfig",
    "cert_refused",
    "peer_node_name",
    "plaintext_refusal_message",
    "records",
    "tls_failure",
]

# The first byte of a TLS record carrying a handshake message (a ClientHello).
TLS_RECORD_HANDSHAKE: Final = 0x16
# How long a TLS listener waits for a new connection's first byte. A TLS client sends its
# ClientHello right behind the TCP handshake's last ACK; a shardex client speaking plaintext
# sends nothing (the server speaks first), so silence this long means plaintext, and it gets
# a refusal it can read instead of a handshake that times out.
SNIFF_TIMEOUT: Final = 1.5
_HINT_CA = "connect with the cluster's CA certificate (connect(..., tls_ca=PATH) / --tls-ca)"


@dataclasses.dataclass(frozen=True)
class TlsConfig:
    """TLS settings of one process: the cluster CA, and a node's certificate and key.

    ``cert``/``key`` None: a user's client (verifies the server, presents nothing; cannot
    listen). The CA is a file (``ca``) or its PEM text (``ca_pem``: a process that got it
    from elsewhere, as the pipeline's read tasks on executors of other hosts)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    ca_pem: str | None = dataclasses.field(default=None, repr=False)
    # Contexts are built once (they read and parse the files) and shared by every socket.
    _contexts: dict[str, ssl.SSLContext] = dataclasses.field(
        default_factory=dict, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        if (self.ca is None) == (self.ca_pem is None):
            raise ConfigError(
                "TLS needs the cluster CA's certificate, as a file or as PEM text (one of them)",
                details={"hint": "give tls_ca (the ca.pem made by `shardex cluster certs`)"},
            )
        if (self.cert is None) != (self.key is None):
            raise ConfigError(
                "a TLS certificate needs its key and a key its certificate",
                details={
                    "value": str(self.cert or self.key),
                    "hint": "give both tls_cert and tls_key, or tls_dir",
                },
            )

    @classmethod
    def for_node(cls, cert_dir: Path, name: str) -> TlsConfig:
        """Node ``name``'s settings from a certificate directory (``certs.py`` layout)."""
        p = node_paths(Path(cert_dir), name)
        return cls(ca=p.ca, cert=p.cert, key=p.key)

    @property
    def is_node(self) -> bool:
        return self.cert is not None

    def server_context(self) -> ssl.SSLContext:
        ctx = self._contexts.get("server")
        if ctx is None:
            if self.cert is None or self.key is None:
                raise ConfigError(
                    "cannot serve TLS without a certificate and key",
                    details={"hint": "give the node tls_dir (or tls_cert and tls_key)"},
                )
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._load(ctx)
            # Optional: users' clients present no certificate (they log in above TLS); one
            # that is presented must verify, or the handshake fails.
            ctx.verify_mode = ssl.CERT_OPTIONAL
            self._contexts["server"] = ctx
        return ctx

    def client_context(self) -> ssl.SSLContext:
        ctx = self._contexts.get("client")
        if ctx is None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED, check_hostname
            self._load(ctx)
            self._contexts["client"] = ctx
        return ctx

    def _load(self, ctx: ssl.SSLContext) -> None:
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        try:
            if self.ca_pem is not None:
                ctx.load_verify_locations(cadata=self.ca_pem)
            else:
                ctx.load_verify_locations(cafile=str(self.ca))
            if self.cert is not None and self.key is not None:
                ctx.load_cert_chain(str(self.cert), str(self.key))
        except FileNotFoundError as e:
            raise ConfigError(
                f"TLS file {e.filename} does not exist",
                details={
                    "value": str(e.filename),
                    "hint": "make the certificates with `shardex cluster certs` and check "
                    "tls_dir / tls_ca / tls_cert / tls_key",
                },
            ) from None
        except (ssl.SSLError, OSError) as e:
            raise ConfigError(
                f"cannot load the TLS files ({self.ca or 'CA given as PEM'}, {self.cert}): {e}",
                details={"value": str(self.cert or self.ca), "hint": "check the PEM files"},
            ) from None


def records(obj: ssl.SSLObject) -> ssl.SSLObject:
    """What moves the records of an in-memory TLS session ``obj`` once its handshake is
    done: the C object under ``ssl.SSLObject`` (the same ``read(n, buffer)``, ``write``
    and ``pending``), without the Python method in front of each call - two of them per
    frame each way, on every request and reply. ``obj`` itself where that is absent."""
    return getattr(obj, "_sslobj", obj)


def peer_node_name(peercert: dict[str, Any] | None) -> str | None:
    """The node name in a verified peer certificate (``ssl``'s ``getpeercert()`` dict), from
    its node marker SAN URI; None for no certificate or one without the marker."""
    if not peercert:
        return None
    for kind, value in peercert.get("subjectAltName", ()):
        if kind == "URI" and isinstance(value, str) and value.startswith(NODE_URI_PREFIX):
            name = value[len(NODE_URI_PREFIX) :]
            return name or None
    return None


# OpenSSL's reasons (``SSLError.reason``) for a peer that refused our certificate, or for a
# byte stream that is not TLS, and what to tell the user.
_REFUSED_US = {
    "TLSV1_ALERT_UNKNOWN_CA": "it does not trust our certificate's CA",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "our certificate has expired",
    "SSLV3_ALERT_BAD_CERTIFICATE": "it refused our certificate",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "it refused our certificate",
    "TLSV1_ALERT_DECRYPT_ERROR": "it refused our certificate",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "it requires a certificate",
    "TLSV1_ALERT_PROTOCOL_VERSION": "it does not speak TLS 1.3",
}
_NOT_TLS = ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG")


def tls_failure(address: str, exc: BaseException) -> ShardexError | None:
    """The clear error for a TLS failure ``exc`` on a connection to ``address``, or None if
    ``exc`` is no TLS failure. A certificate that does not verify (wrong CA, expired, not
    issued for this address), on either side, is ``AuthFailed``; a peer that is not speaking
    TLS (a plaintext port) is ``NodeUnavailable``."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        reason = exc.verify_message or str(exc)
        return AuthFailed(
            f"TLS: cannot verify the certificate of {address}: {reason}",
            details={"address": address, "reason": reason, "hint": _verify_hint(reason)},
        )
    if not isinstance(exc, ssl.SSLError):
        return None
    why = exc.reason or ""
    if why in _REFUSED_US:
        return AuthFailed(
            f"TLS: {address} refused the connection: {_REFUSED_US[why]}",
            details={
                "address": address,
                "reason": why,
                "hint": "this node's certificate must be signed by the cluster CA and current",
            },
        )
    if why in _NOT_TLS:
        return NodeUnavailable(
            f"TLS: {address} does not speak TLS (a plaintext port?)",
            details={
                "address": address,
                "reason": why,
                "hint": "connect without TLS, or turn TLS on at that node",
            },
        )
    return NodeUnavailable(
        f"TLS with {address} failed: {why or exc}",
        details={"address": address, "reason": why or str(exc)},
    )


def cert_refused(address: str) -> AuthFailed:
    """A TLS server that closed the connection before its first byte after we presented a
    certificate: in TLS 1.3 that is how a refused client certificate looks from here."""
    return AuthFailed(
        f"TLS: {address} closed the connection before its first message: it did not accept "
        "our certificate (signed by another CA, or expired?); its log says why",
        details={
            "address": address,
            "reason": "certificate refused",
            "hint": "this node's certificate must be current and signed by the cluster CA",
        },
    )


def _verify_hint(reason: str) -> str:
    if "expired" in reason:
        return "renew the node's certificate: shardex cluster certs ... --node NAME"
    if "issuer" in reason or "self-signed" in reason or "self signed" in reason:
        return f"the server's certificate is not signed by this CA: {_HINT_CA}"
    if "mismatch" in reason or "hostname" in reason:
        return "dial an address the node's certificate names (its --ip / --dns entries)"
    return _HINT_CA


def plaintext_refusal_message(address: str) -> str:
    return f"{address} requires TLS: this connection speaks plaintext"


REFUSAL_HINT: Final = _HINT_CA
