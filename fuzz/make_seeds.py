#!/usr/bin/env python3
"""Regenerates the certificate seeds of the fuzz corpus (fuzz/seeds/...).

Needs the `cryptography` package. The private keys are thrown away: only public
certificates, a CSR and a CRL are written. The anchor (fuzz/seeds/anchor.pem) is what the
x509_chain and crl targets trust; the seeds are valid from 2026-01-01 to 2036-01-01 and
the targets check them at a fixed time inside that range, so runs are repeatable.
"""
import datetime
import pathlib

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HERE = pathlib.Path(__file__).parent / "seeds"
START = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
END = datetime.datetime(2036, 1, 1, tzinfo=datetime.timezone.utc)


def name(cn):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def ca(subject, key, issuer, issuer_key, serial):
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    builder = (
        x509.CertificateBuilder()
        .subject_name(name(subject))
        .issuer_name(name(issuer))
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(START)
        .not_valid_after(END)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(ski, critical=False)
    )
    if issuer_key is not key:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def pem(obj):
    return obj.public_bytes(serialization.Encoding.PEM).decode()


root_key = ec.generate_private_key(ec.SECP256R1())
root = ca("Fuzz Root", root_key, "Fuzz Root", root_key, 1)
inter_key = ec.generate_private_key(ec.SECP256R1())
inter = ca("Fuzz Factory", inter_key, "Fuzz Root", root_key, 2)
leaf_key = ed25519.Ed25519PrivateKey.generate()
leaf = (
    x509.CertificateBuilder()
    .subject_name(name("robot-1"))
    .issuer_name(name("Fuzz Factory"))
    .public_key(leaf_key.public_key())
    .serial_number(0x1234)
    .not_valid_before(START)
    .not_valid_after(END)
    .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    .add_extension(
        x509.KeyUsage(True, False, False, False, False, False, False, False, False),
        critical=True,
    )
    .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    .add_extension(x509.SubjectAlternativeName([x509.DNSName("robot-1")]), critical=False)
    .add_extension(
        x509.AuthorityKeyIdentifier.from_issuer_public_key(inter_key.public_key()),
        critical=False,
    )
    .sign(inter_key, hashes.SHA256())
)
crl = (
    x509.CertificateRevocationListBuilder()
    .issuer_name(name("Fuzz Root"))
    .last_update(START)
    .next_update(END)
    .add_revoked_certificate(
        x509.RevokedCertificateBuilder().serial_number(7).revocation_date(START).build()
    )
    .add_extension(x509.CRLNumber(1), critical=False)
    .add_extension(
        x509.AuthorityKeyIdentifier.from_issuer_public_key(root_key.public_key()),
        critical=False,
    )
    .sign(root_key, hashes.SHA256())
)
csr = (
    x509.CertificateSigningRequestBuilder()
    .subject_name(name("robot-1"))
    .add_extension(x509.SubjectAlternativeName([x509.DNSName("robot-1")]), critical=False)
    .sign(ec.generate_private_key(ec.SECP256R1()), hashes.SHA256())
)

(HERE / "anchor.pem").write_text(pem(root))
for target in ["x509_chain", "crl", "csr"]:
    (HERE / target).mkdir(parents=True, exist_ok=True)
(HERE / "x509_chain" / "leaf_and_intermediate.pem").write_text(pem(leaf) + pem(inter))
(HERE / "x509_chain" / "leaf_only.pem").write_text(pem(leaf))
(HERE / "crl" / "root.crl.pem").write_text(pem(crl))
(HERE / "crl" / "root.crl.der").write_bytes(crl.public_bytes(serialization.Encoding.DER))
(HERE / "crl" / "with_intermediate.pem").write_text(pem(crl) + pem(inter))
(HERE / "csr" / "robot-1.csr").write_text(pem(csr))
