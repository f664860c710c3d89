"""A run's credentials: the job token and the TLS certificates of both planes.

``dipsjax credentials DIR`` (or :func:`create`) writes, in a directory only its owner can
read:

- ``ca.pem``: a certificate authority made for this job alone. Its private key is thrown
  away once it has signed, so no one can mint another certificate the job would trust.
- ``cert.pem``, ``key.pem``: the job's certificate (EC P-256, for the hosts given), for
  server and client authentication. Every process of the run presents it: the leader's
  gRPC server and the followers' data planes ask each client for it (mutual TLS), and
  clients check the server's against ``ca.pem`` and the host name.
- ``token``: the per-job credential that every control-plane call also carries, checked by
  the leader (in constant time) on each call.

A client without these files can neither connect to the data plane (no TLS handshake) nor
to the control plane. A stolen certificate and key without the token still cannot make a
control-plane call; on the data plane the certificate and key are the credential (guard
``key.pem`` as the token). Only the directory's path goes into ``spec.json``; no secret is
logged or put on a tape. The certificates are valid for ``days`` (365 by default): a job
or a snapshot resumed after that needs a fresh set.

Push tickets (:func:`push_ticket`): the leader signs each push it grants, a MAC of the
round, learner and incarnation under a key derived from the token, and followers check it
on a push's first header. Every role of a job holds the token, so a ticket does not guard
against a process of the job that mints them on purpose; it keeps out pushes for rounds
the leader never opened to that learner process (a stale or confused learner, a forged or
replayed stream), before any of their bytes are buffered.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import hmac
import ipaddress
import os
import secrets
import ssl
import struct
from collections.abc import Sequence
from pathlib import Path

FILES = ("ca.pem", "cert.pem", "key.pem", "token")
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")


def create(
    directory: str | Path, hosts: Sequence[str] = DEFAULT_HOSTS, days: int = 365
) -> Credentials:
    """Writes a fresh set of credentials into ``directory`` (made, mode 0700; the key and
    token 0600) for processes at ``hosts`` (names or IP addresses); returns them loaded."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if days < 1:
        raise ValueError(f"credentials: days must be >= 1, got {days}")
    if not hosts:
        raise ValueError("credentials: name at least one host")
    directory = Path(directory)
    existing = [f for f in FILES if (directory / f).exists()]
    if existing:
        raise FileExistsError(f"credentials: {directory} already holds {', '.join(existing)}")
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)

    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    job = secrets.token_hex(4)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"dipsjax job CA {job}")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
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
        .sign(ca_key, hashes.SHA256())
    )
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"dipsjax job {job}")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM

    def write(name: str, data: bytes, mode: int) -> None:
        fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    write("ca.pem", ca.public_bytes(pem), 0o644)
    write("cert.pem", cert.public_bytes(pem), 0o644)
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    write("key.pem", key_pem, 0o600)
    write("token", secrets.token_hex(32).encode(), 0o600)
    return load(directory)


@dataclasses.dataclass(frozen=True, repr=False)
class Credentials:
    """A run's credentials, loaded (``repr`` shows the directory only, never a secret)."""

    directory: str
    ca: bytes
    cert: bytes
    key: bytes
    token: str

    def __repr__(self) -> str:
        return f"Credentials({self.directory!r})"

    # ------------------------------------------------------------------ control plane

    def grpc_server(self):
        """gRPC server credentials: TLS with this job's certificate, clients must present
        one signed by the job's CA."""
        import grpc

        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.ca, require_client_auth=True
        )

    def grpc_channel(self):
        """gRPC channel credentials: trusts only the job's CA, presents the job's cert."""
        import grpc

        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )

    # --------------------------------------------------------------------- data plane

    def ssl_server(self) -> ssl.SSLContext:
        """The data-plane server's TLS context (mutual: a client must show a job cert)."""
        return self._context(ssl.PROTOCOL_TLS_SERVER)

    def ssl_client(self) -> ssl.SSLContext:
        """The data-plane client's TLS context (checks the server's cert and host name)."""
        return self._context(ssl.PROTOCOL_TLS_CLIENT)

    def _context(self, protocol: int) -> ssl.SSLContext:
        ctx = ssl.SSLContext(protocol)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.load_verify_locations(cadata=self.ca.decode())
        d = Path(self.directory)
        ctx.load_cert_chain(d / "cert.pem", d / "key.pem")
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


TICKET_BYTES = 16


@functools.cache
def _ticket_key(token: str) -> bytes:
    return hmac.digest(token.encode(), b"dipsjax push ticket v1", hashlib.sha256)


def push_ticket(token: str, round_id: int, learner: int, incarnation: int) -> bytes:
    """The leader's grant of round ``round_id`` to ``learner``'s process ``incarnation``:
    :data:`TICKET_BYTES` bytes of HMAC-SHA256 under a key derived from the job token."""
    grant = struct.pack("<qqq", round_id, learner, incarnation)
    return hmac.digest(_ticket_key(token), grant, hashlib.sha256)[:TICKET_BYTES]


@functools.cache
def load(directory: str | Path) -> Credentials:
    """The credentials in ``directory``; names the file missing, if one is."""
    d = Path(directory)
    missing = [f for f in FILES if not (d / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"credentials: {d} lacks {', '.join(missing)} "
            "(make them with `dipsjax credentials DIR`)"
        )
    from dipsjax.runtime.permissions import check_secret

    for secret in (d, d / "key.pem", d / "token"):
        check_secret(secret)  # a key or token others may read is refused, with the fix
    token = (d / "token").read_text().strip()
    if len(token) < 32:
        raise ValueError(f"credentials: {d / 'token'} holds a token shorter than 32 characters")
    return Credentials(
        str(d),
        (d / "ca.pem").read_bytes(),
        (d / "cert.pem").read_bytes(),
        (d / "key.pem").read_bytes(),
        token,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``dipsjax credentials DIR [--hosts h1,h2] [--days N]``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="dipsjax credentials",
        description="Create a run's credentials: a job CA, the job's TLS certificate and key, "
        "and the job token. Pass the directory to `dipsjax run --credentials DIR`.",
    )
    parser.add_argument("directory")
    parser.add_argument(
        "--hosts",
        default=",".join(DEFAULT_HOSTS),
        help="comma-separated host names or IP addresses the processes run on "
        f"(default {','.join(DEFAULT_HOSTS)})",
    )
    parser.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    args = parser.parse_args(argv)
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
    try:
        create(args.directory, hosts, args.days)
    except (FileExistsError, ValueError) as e:
        parser.error(str(e))
    print(f"credentials for hosts {', '.join(hosts)} written to {args.directory}")
    return 0
