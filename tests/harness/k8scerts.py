"""The test cluster's certificates (tests/harness/k8scluster.py), made on the spot with openssl: a CA, the
API server's serving certificate, one client certificate in system:masters (every component, kubectl and
nvc-py's driver use it: the tests are about the node, not RBAC) and the service account signing key."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class Certificates:
    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    def cert(self, name: str) -> Path:
        return self.directory / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.directory / f"{name}.key"


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def _signed(certs: Certificates, name: str, subject: str, extensions: str) -> None:
    """A key and a certificate for ``subject`` signed by the CA, with ``extensions`` (an openssl section)."""
    request = certs.directory / f"{name}.csr"
    extfile = certs.directory / f"{name}.ext"
    extfile.write_text(extensions)
    _openssl("req", "-new", *EC, "-subj", subject, "-keyout", certs.key(name), "-out", request)
    _openssl(
        "x509", "-req", "-in", request, "-CA", certs.ca, "-CAkey", certs.key("ca"), "-CAcreateserial",
        "-days", "2", "-extfile", extfile, "-out", certs.cert(name),
    )  # fmt: skip


def make(directory: Path, addresses: tuple[str, ...]) -> Certificates:
    """The cluster's certificates in ``directory``; the API server's names ``addresses`` (IPs) and
    the in-cluster service names."""
    certs = Certificates(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", *EC, "-days", "2", "-subj", "/CN=nvc-py-test-ca", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-keyout", certs.key("ca"), "-out", certs.ca,
    )  # fmt: skip
    names = ",".join(
        [f"IP:{a}" for a in addresses]
        + [f"DNS:kubernetes{s}" for s in ("", ".default", ".default.svc", ".default.svc.cluster.local")]
    )
    _signed(
        certs,
        "apiserver",
        "/CN=kube-apiserver",
        f"subjectAltName={names}\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n",
    )
    _signed(
        certs,
        "admin",
        "/O=system:masters/CN=nvc-py-test",
        "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n",
    )
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", certs.key("sa"))
    _openssl("pkey", "-in", certs.key("sa"), "-pubout", "-out", certs.cert("sa"))
    return certs
