"""``shardex cluster certs``: the CA and node certificates in the documented layout, with
the addresses given per node and for every node; bad input exits 2 naming it."""

from __future__ import annotations

import stat
from pathlib import Path

from cryptography import x509
from typer.testing import CliRunner

from shardex.cli.main import app


def _sans(path: Path) -> list[str]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(v) for v in san.get_values_for_type(x509.DNSName)] + [
        str(v) for v in san.get_values_for_type(x509.IPAddress)
    ]


def test_certs_command(tmp_path: Path) -> None:
    d = tmp_path / "certs"
    args = ["cluster", "certs", "--dir", str(d), "--node", "node1=10.0.0.1,db1.example.com"]
    result = CliRunner().invoke(app, [*args, "--node", "node2", "--ip", "10.0.0.9"])
    assert result.exit_code == 0, result.output
    assert sorted(_sans(d / "nodes" / "node1.pem")) == ["10.0.0.1", "10.0.0.9", "db1.example.com"]
    assert _sans(d / "nodes" / "node2.pem") == ["10.0.0.9"]
    for key in (d / "ca.key", d / "nodes" / "node1.key", d / "nodes" / "node2.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    bad = CliRunner().invoke(app, ["cluster", "certs", "--dir", str(d), "--node", "node3"])
    assert bad.exit_code == 2 and "no address for node 'node3'" in bad.output
