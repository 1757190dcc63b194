"""The cluster's certificates (``shardex.net.certs``), the node marker read back from a peer
certificate, the node config's TLS keys, and a local cluster directory made with TLS."""

from __future__ import annotations

import ipaddress
import re
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from shardex.errors import ConfigError
from shardex.meta import cluster_dir as cdir
from shardex.net.certs import (
    CA_CERT,
    CA_KEY,
    make_ca,
    make_cluster_certs,
    make_node_cert,
    node_paths,
)
from shardex.net.tls import TlsConfig, peer_node_name
from shardex.node.config import load_config


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_ca_and_node_certificates(tmp_path: Path) -> None:
    make_cluster_certs(tmp_path, {"node1": ["10.0.0.5", "db1.example.com", "::1"]})
    ca = x509.load_pem_x509_certificate((tmp_path / CA_CERT).read_bytes())
    p = node_paths(tmp_path, "node1")
    cert = x509.load_pem_x509_certificate(p.cert.read_bytes())
    assert _mode(tmp_path / CA_KEY) == 0o600 and _mode(p.key) == 0o600
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.public_key().curve.name == "secp256r1"  # type: ignore[union-attr]
    assert cert.issuer == ca.subject
    ca.public_key().verify(  # type: ignore[union-attr,call-arg]
        cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm)
    )
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["shardex-node:node1"]
    assert san.get_values_for_type(x509.DNSName) == ["db1.example.com"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("10.0.0.5"),
        ipaddress.ip_address("::1"),
    ]
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "node1"


def test_the_ca_is_kept_when_made_again(tmp_path: Path) -> None:
    make_ca(tmp_path)
    before = (tmp_path / CA_CERT).read_bytes()
    make_cluster_certs(tmp_path, {"node2": ["127.0.0.1"]})
    assert (tmp_path / CA_CERT).read_bytes() == before


def test_bad_input_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no cluster CA"):
        make_node_cert(tmp_path, "node1", ["127.0.0.1"])
    make_ca(tmp_path)
    with pytest.raises(ConfigError, match="bad node name 'node 1'"):
        make_node_cert(tmp_path, "node 1", ["127.0.0.1"])
    with pytest.raises(ConfigError, match=re.escape("bad certificate address '10.0.0.1:7100'")):
        make_node_cert(tmp_path, "node1", ["10.0.0.1:7100"])
    with pytest.raises(ConfigError, match="no address"):
        make_node_cert(tmp_path, "node1", [])


def test_peer_node_name_reads_the_marker_only() -> None:
    marked = {"subjectAltName": (("IP Address", "127.0.0.1"), ("URI", "shardex-node:n7"))}
    assert peer_node_name(marked) == "n7"
    assert peer_node_name({"subjectAltName": (("URI", "https://example.com"),)}) is None
    assert peer_node_name({"subject": ((("commonName", "n7"),),)}) is None  # a CN is no marker
    assert peer_node_name(None) is None
    assert peer_node_name({}) is None


def _cfg(tmp_path: Path, **extra: object) -> dict[str, object]:
    return {"name": "node1", "data_dir": str(tmp_path / "d"), "secret": "s" * 32, **extra}


def test_node_config_tls_keys(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    make_cluster_certs(certs, {"node1": ["127.0.0.1"]})
    assert load_config(None, _cfg(tmp_path)).tls is None  # loopback: off unless asked
    tls = load_config(None, _cfg(tmp_path, tls="on", tls_dir=str(certs))).tls
    assert tls == TlsConfig.for_node(certs.absolute(), "node1")
    # Explicit paths override the directory's, one by one.
    other_ca = tmp_path / "other.pem"
    other_ca.write_bytes((certs / CA_CERT).read_bytes())
    tls = load_config(None, _cfg(tmp_path, tls="on", tls_dir=str(certs), tls_ca=str(other_ca))).tls
    assert tls is not None and tls.ca == other_ca.absolute()
    assert load_config(None, _cfg(tmp_path, tls="off", tls_dir=str(certs))).tls is None


def test_node_config_tls_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'tls': not a TLS mode"):
        load_config(None, _cfg(tmp_path, tls="maybe"))
    with pytest.raises(ConfigError, match="'tls_ca': missing: TLS is on"):
        load_config(None, _cfg(tmp_path, tls="on"))
    with pytest.raises(ConfigError, match="'tls_ca': no such file"):
        load_config(None, _cfg(tmp_path, tls="on", tls_dir=str(tmp_path / "none")))


def test_tls_is_on_by_default_off_loopback(tmp_path: Path) -> None:
    # ``host`` comes from the node's addressing settings; the TLS default follows it.
    from shardex.node import config

    values = {"tls": "auto"}
    with pytest.raises(ConfigError, match=re.escape("on by default for host 10.1.2.3")):
        config._tls(values, {}, "node1", "10.1.2.3")
    assert config._tls(values, {}, "node1", "127.0.0.1") is None
    assert config._tls(values, {}, "node1", "::1") is None
    assert config._tls(values, {}, "node1", "localhost") is None


def test_cluster_dir_with_tls(tmp_path: Path) -> None:
    spec = cdir.create(tmp_path, nodes=2, tls=True)
    assert spec.tls_dir == cdir.CERTS_DIR
    assert cdir.tls_ca(tmp_path, spec) == (tmp_path / "certs" / CA_CERT).absolute()
    # Each node's config turns TLS on with the cluster's certificates, as the node reads it.
    for node in spec.nodes:
        cfg = load_config(node.path(tmp_path) / cdir.NODE_CONFIG_FILE)
        want = TlsConfig.for_node(tmp_path / "certs", node.name)
        assert cfg.tls is not None and cfg.tls.cert is not None and cfg.tls.key is not None
        assert (cfg.tls.ca.resolve(), cfg.tls.cert.resolve(), cfg.tls.key.resolve()) == (
            want.ca.resolve(),
            want.cert.resolve(),  # type: ignore[union-attr]
            want.key.resolve(),  # type: ignore[union-attr]
        )
    spec, added = cdir.add_node(tmp_path, spec)
    assert node_paths(tmp_path / "certs", added.name).cert.is_file()
    plain = tmp_path / "plain"
    assert cdir.tls_ca(plain, cdir.create(plain, nodes=1)) is None
