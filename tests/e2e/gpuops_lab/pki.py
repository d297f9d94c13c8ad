"""The lab's certificates (openssl): one CA signs the API server's serving certificate, the admin client
(group system:masters), the API server's kubelet client, the controller manager and scheduler, and each
kubelet's client certificate (system:node:<name> in group system:nodes, what the Node authorizer and
NodeRestriction expect). P-256 keys: as good as RSA here and generated in milliseconds."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .config import LabConfig
from .util import log, run

SERVICE_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")


def _quiet(argv: list[str | Path], what: str) -> None:
    run(argv, what=what, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def genkey(path: Path) -> None:
    """A new P-256 private key at ``path``."""
    _quiet(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path], "openssl")


def sign_cert(pki: Path, name: str, subject: str, extensions: list[str] | None = None) -> None:
    """``pki/NAME.crt`` and ``.key`` signed by the lab CA, unless they exist (a client cert by default)."""
    if (pki / f"{name}.crt").is_file():
        return
    key, csr, ext = pki / f"{name}.key", pki / f"{name}.csr", pki / f"{name}.ext"
    genkey(key)
    _quiet(["openssl", "req", "-new", "-key", key, "-subj", subject, "-out", csr], "openssl req")
    # The extensions RFC 5280 asks of an issued certificate, which Python 3.13's default TLS context checks
    # (VERIFY_X509_STRICT): the issuer's key identifier among them.
    lines = [
        "basicConstraints=CA:FALSE",
        "keyUsage=critical,digitalSignature",
        "subjectKeyIdentifier=hash",
        "authorityKeyIdentifier=keyid",
    ]
    lines += extensions or ["extendedKeyUsage=clientAuth"]
    ext.write_text("".join(f"{line}\n" for line in lines))
    _quiet(
        [
            "openssl",
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            pki / "ca.crt",
            "-CAkey",
            pki / "ca.key",
            "-CAcreateserial",
            "-days",
            "30",
            "-sha256",
            "-extfile",
            ext,
            "-out",
            pki / f"{name}.crt",
        ],
        "openssl x509",
    )
    csr.unlink(missing_ok=True)


def apiserver_sans(cfg: LabConfig) -> str:
    """The API server certificate's subjectAltName: loopback, the service IP and the service names."""
    names = ",".join(f"DNS:{n}" for n in SERVICE_NAMES)
    return f"IP:127.0.0.1,IP:{cfg.net_prefix}.0.1,{names}"


def make_pki(cfg: LabConfig) -> None:
    """The CA, the control plane's certificates and the service-account key pair (what is missing)."""
    pki = cfg.pki
    pki.mkdir(parents=True, exist_ok=True)
    os.chmod(pki, 0o700)
    if not (pki / "ca.crt").is_file():
        log("generating the lab CA and certificates (openssl)")
        genkey(pki / "ca.key")
        _quiet(
            [
                "openssl",
                "req",
                "-x509",
                "-new",
                "-key",
                pki / "ca.key",
                "-out",
                pki / "ca.crt",
                "-days",
                "30",
                "-subj",
                "/CN=gpuops-lab-ca",
                # A CA's key usage: without it Python 3.13's strict verification refuses the CA.
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
            "openssl req -x509",
        )
    sign_cert(
        pki, "apiserver", "/CN=kube-apiserver", ["extendedKeyUsage=serverAuth", f"subjectAltName={apiserver_sans(cfg)}"]
    )
    sign_cert(pki, "admin", "/O=system:masters/CN=gpuops-lab-admin")
    sign_cert(pki, "apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client")
    # The names RBAC's bootstrap policy binds the system:kube-controller-manager and
    # system:kube-scheduler roles to.
    sign_cert(pki, "kube-controller-manager", "/CN=system:kube-controller-manager")
    sign_cert(pki, "kube-scheduler", "/CN=system:kube-scheduler")
    if not (pki / "sa.key").is_file():
        genkey(pki / "sa.key")
        _quiet(["openssl", "pkey", "-in", pki / "sa.key", "-pubout", "-out", pki / "sa.pub"], "openssl pkey")


def sign_kubelet_cert(cfg: LabConfig, index: int) -> str:
    """Node ``index``'s kubelet client certificate; returns its name under the PKI directory."""
    node = cfg.node_name(index)
    sign_cert(cfg.pki, f"kubelet-{node}", f"/O=system:nodes/CN=system:node:{node}")
    return f"kubelet-{node}"


def kubeconfig_text(
    server: str,
    ca: str | Path,
    user: str,
    cert: str | Path | None = None,
    key: str | Path | None = None,
    token: str | None = None,
) -> str:
    """A kubeconfig with one cluster, user and context, all named for the lab; the user has a client
    certificate and key, or a bearer token."""
    credentials = (
        f"    token: {token}\n" if token is not None else f"    client-certificate: {cert}\n    client-key: {key}\n"
    )
    return f"""apiVersion: v1
kind: Config
clusters:
- name: gpuops-lab
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: {user}
  user:
{credentials}contexts:
- name: gpuops-lab
  context: {{cluster: gpuops-lab, user: {user}}}
current-context: gpuops-lab
"""


def write_kubeconfigs(cfg: LabConfig) -> None:
    """The admin's kubeconfig and those of the controller manager and the scheduler."""
    server, pki = f"https://127.0.0.1:{cfg.api_port}", cfg.pki
    cfg.admin_kubeconfig.write_text(
        kubeconfig_text(server, pki / "ca.crt", "gpuops-lab-admin", pki / "admin.crt", pki / "admin.key")
    )
    for component in ("kube-controller-manager", "kube-scheduler"):
        (cfg.lab / f"{component}.kubeconfig").write_text(
            kubeconfig_text(
                server, pki / "ca.crt", f"system:{component}", pki / f"{component}.crt", pki / f"{component}.key"
            )
        )


def make_ssh_key(cfg: LabConfig) -> None:
    """The login key of the nodes' user (a fleet's machine credential) and an empty known_hosts."""
    cfg.ssh_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(cfg.ssh_dir, 0o700)
    if not cfg.ssh_key.is_file():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", cfg.name, "-f", cfg.ssh_key], what="ssh-keygen")
    cfg.known_hosts.touch()
