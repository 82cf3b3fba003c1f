"""Webhook TLS: generated, reused while valid, re-issued from the same CA, or
read as someone else manages it."""

from __future__ import annotations

import ssl
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from vramguard_operator.controller.certs import (
    build_ca,
    build_server_cert,
    cert_problem,
    ensure_certificates,
)

from .builders import NOW

HOSTS = ["127.0.0.1", "localhost", "vramguard.vramguard-system.svc"]


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_generated_files_work_for_a_tls_server_and_client(tmp_path: Path) -> None:
    tls = ensure_certificates(tmp_path / "tls", HOSTS, NOW)
    assert tls.managed and tls.issued and tls.ca is not None
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(tls.cert, tls.key)  # raises when key and certificate differ
    cert = load(tls.cert)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert sans.get_values_for_type(x509.DNSName) == HOSTS[1:]
    cert.verify_directly_issued_by(load(tls.ca))
    assert oct(tls.key.stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "tls" / "ca.key").stat().st_mode & 0o777) == "0o600"


def test_reused_while_valid(tmp_path: Path) -> None:
    first = ensure_certificates(tmp_path, HOSTS, NOW)
    before = first.cert.read_bytes()
    again = ensure_certificates(tmp_path, HOSTS[:2], NOW + timedelta(days=10))
    assert not again.issued and again.cert.read_bytes() == before


def test_reissued_from_the_same_ca_for_new_hosts_or_near_expiry(tmp_path: Path) -> None:
    first = ensure_certificates(tmp_path, HOSTS, NOW)
    assert first.ca is not None
    ca_before = first.ca.read_bytes()
    more = ensure_certificates(tmp_path, [*HOSTS, "10.0.0.7"], NOW)
    assert more.issued and first.ca.read_bytes() == ca_before
    late = ensure_certificates(tmp_path, HOSTS, NOW + timedelta(days=350))
    assert late.issued and first.ca.read_bytes() == ca_before
    assert load(late.cert).not_valid_after_utc > NOW + timedelta(days=700)


def test_broken_files_are_replaced(tmp_path: Path) -> None:
    ensure_certificates(tmp_path, HOSTS, NOW)
    (tmp_path / "tls.crt").write_text("garbage")
    assert ensure_certificates(tmp_path, HOSTS, NOW).issued
    (tmp_path / "ca.key").write_text("garbage")  # a lost CA key: a new CA
    ca_before = (tmp_path / "ca.crt").read_bytes()
    assert ensure_certificates(tmp_path, HOSTS, NOW).issued
    assert (tmp_path / "ca.crt").read_bytes() != ca_before


def test_files_managed_elsewhere_are_only_read(tmp_path: Path) -> None:
    # as cert-manager or the chart's Secret lays them out: no ca.key
    ca_key, ca = build_ca(NOW)
    key, cert = build_server_cert(ca_key, ca, ["vramguard.vramguard-system.svc"], NOW)
    (tmp_path / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "tls.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    before = sorted(p.name for p in tmp_path.iterdir())
    tls = ensure_certificates(tmp_path, HOSTS, NOW)
    assert not tls.managed and not tls.issued and tls.ca is None
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_cert_problem_names_the_reason() -> None:
    ca_key, ca = build_ca(NOW)
    key, cert = build_server_cert(ca_key, ca, HOSTS, NOW)
    assert cert_problem(cert, key, ca, HOSTS, NOW) is None
    assert "expires" in (cert_problem(cert, key, ca, HOSTS, NOW + timedelta(days=400)) or "")
    assert cert_problem(cert, key, ca, ["other.example"], NOW) == "it does not cover other.example"
    other_key, _ = build_server_cert(ca_key, ca, HOSTS, NOW)
    assert cert_problem(cert, other_key, ca, HOSTS, NOW) == "its key does not match"
    _, other_ca = build_ca(NOW)
    assert cert_problem(cert, key, other_ca, HOSTS, NOW) == "it is not signed by the CA"


def test_hosts_are_required() -> None:
    ca_key, ca = build_ca(NOW)
    with pytest.raises(ValueError, match="at least one host"):
        build_server_cert(ca_key, ca, [], NOW)
