"""TLS for the admission webhooks: a CA and a serving certificate made with the
``cryptography`` package, or files someone else manages (cert-manager, the
Helm chart's Secret).

A directory holds the files under the names a ``kubernetes.io/tls`` Secret and
cert-manager use: ``tls.crt``, ``tls.key`` and ``ca.crt``. When it also holds
``ca.key``, vramguard made the CA and maintains the directory: the serving
certificate is reused while it is valid (signed by the CA, covering every
requested host, its key matching, more than ``renew_before`` left), and
re-issued from the same CA otherwise, so the CA bundle the API server trusts
stays the same. Without ``ca.key`` but with ``tls.crt`` and ``tls.key``, the
files are managed elsewhere and only read. (kopf's own self-signed path needs
``certbuilder``/``oscrypto``, which fail with current OpenSSL.)

Keys are ECDSA P-256; keys are written with mode 0600, atomically.
"""

from __future__ import annotations

import ipaddress
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_NAME = "vramguard-webhook-ca"
CERT, KEY, CA, CA_KEY = "tls.crt", "tls.key", "ca.crt", "ca.key"
DEFAULT_VALIDITY = timedelta(days=365)
CA_VALIDITY = timedelta(days=3650)
DEFAULT_RENEW_BEFORE = timedelta(days=30)
_BACKDATE = timedelta(minutes=5)  # tolerate clock skew between the operator and the API server


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """Paths of the serving certificate, its key and the CA bundle (``ca`` is
    None when the directory has no ``ca.crt``: then the certificate is its own
    bundle). ``managed``: whether vramguard made and maintains them. ``issued``:
    whether this call wrote a new serving certificate."""

    cert: Path
    key: Path
    ca: Path | None
    managed: bool
    issued: bool = False


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def build_ca(now: datetime, validity: timedelta = CA_VALIDITY) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A new self-signed CA (key, certificate) valid from ``now`` (minus 5 minutes)."""
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def build_server_cert(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    hosts: Sequence[str],
    now: datetime,
    validity: timedelta = DEFAULT_VALIDITY,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A serving certificate for ``hosts`` (IP addresses become IP SANs, other
    names DNS SANs; the first is the common name), signed by the CA. Raises
    ``ValueError`` when ``hosts`` is empty."""
    if not hosts:
        raise ValueError("webhook certificate: at least one host is needed")
    key = _new_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0][:64])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(min(now + validity, ca_cert.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def cert_problem(
    cert: x509.Certificate,
    key: ec.EllipticCurvePrivateKey | object,
    ca: x509.Certificate,
    hosts: Iterable[str],
    now: datetime,
    renew_before: timedelta = DEFAULT_RENEW_BEFORE,
) -> str | None:
    """Why the serving certificate cannot be reused, or None when it can."""
    if now < cert.not_valid_before_utc or now + renew_before > cert.not_valid_after_utc:
        return f"it expires {cert.not_valid_after_utc.isoformat()}"
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "it is not signed by the CA"
    public = getattr(key, "public_key", None)
    if public is None or _spki(public()) != _spki(cert.public_key()):
        return "its key does not match"
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "it has no subject alternative names"
    missing = [h for h in hosts if _san(h) not in sans]
    return f"it does not cover {', '.join(missing)}" if missing else None


def _spki(public_key: Any) -> bytes:
    return bytes(
        public_key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _load_ca(d: Path, now: datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate] | None:
    try:
        key = serialization.load_pem_private_key((d / CA_KEY).read_bytes(), password=None)
        cert = x509.load_pem_x509_certificate((d / CA).read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or now + DEFAULT_RENEW_BEFORE > cert.not_valid_after_utc:
        return None
    return key, cert


def _reusable(d: Path, ca: x509.Certificate, hosts: Sequence[str], now: datetime) -> bool:
    try:
        cert = x509.load_pem_x509_certificate((d / CERT).read_bytes())
        key = serialization.load_pem_private_key((d / KEY).read_bytes(), password=None)
    except (OSError, ValueError):
        return False
    return cert_problem(cert, key, ca, hosts, now) is None


def ensure_certificates(
    directory: str | os.PathLike[str],
    hosts: Sequence[str],
    now: datetime | None = None,
) -> TLSFiles:
    """Make sure ``directory`` holds a serving certificate for ``hosts`` (see the
    module doc); creates the directory when missing. Returns the paths.

    Raises ``OSError`` when the directory cannot be written and holds nothing
    usable, and ``ValueError`` when ``hosts`` is empty.
    """
    d = Path(directory)
    now = now or datetime.now(UTC)
    if not (d / CA_KEY).exists() and (d / CERT).exists() and (d / KEY).exists():
        ca = d / CA if (d / CA).exists() else None
        return TLSFiles(d / CERT, d / KEY, ca, managed=False)
    d.mkdir(parents=True, exist_ok=True)
    loaded = _load_ca(d, now)
    if loaded is not None and _reusable(d, loaded[1], hosts, now):
        return TLSFiles(d / CERT, d / KEY, d / CA, managed=True)
    if loaded is None:
        ca_key, ca_cert = build_ca(now)
        _write(d / CA_KEY, _pem_key(ca_key), 0o600)
        _write(d / CA, _pem_cert(ca_cert), 0o644)
    else:
        ca_key, ca_cert = loaded
    key, cert = build_server_cert(ca_key, ca_cert, hosts, now)
    _write(d / KEY, _pem_key(key), 0o600)
    _write(d / CERT, _pem_cert(cert), 0o644)
    return TLSFiles(d / CERT, d / KEY, d / CA, managed=True, issued=True)
