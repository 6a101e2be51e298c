"""A second host for the tests: a Docker engine in its own network namespace, over TLS.

``scripts/engine netns NAME`` makes the namespace and a veth pair with a /30 that
exists only between this host and the namespace; the certificates (a CA, a server
certificate for the namespace's address, a client certificate) are made here with
``cryptography``; ``scripts/engine tls-node NAME --tls DIR`` starts dockerd in the
namespace on ``tcp://ADDRESS:2376`` with ``--tlsverify``. Sessions on that node use
the namespace's network, so the Hub and its proxy reach them over the veth, as they
would reach another machine; the Hub must listen on the host's end of the veth
(``hub_ip``) for the sessions to reach its API.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from harness import REPO
from spawner.runtime.dockernodes import docker_client

ENGINE = REPO / "scripts" / "engine"
RUN_DIR = Path("/var/run/budgethub")
IMAGES = ("budgethub/base:latest", "budgethub/gpu:latest")
"""What a session on the node runs (the gpu image is built on base, so most layers travel once)."""


class NetnsUnavailable(RuntimeError):
    """This machine cannot make network namespaces (not root, no iproute2, no CAP_SYS_ADMIN)."""


def netns_possible() -> str | None:
    """None when ``ip netns add`` works here; otherwise why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("nsenter") is None:
        return "the ip (iproute2) and nsenter (util-linux) commands are needed"
    probe = f"bh-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    usage: x509.ObjectIdentifier | None = None,
    ip: str | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
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
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if ip is not None:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def make_certificates(directory: Path, server_ip: str) -> None:
    """ca.pem, server-cert.pem/server-key.pem (for ``server_ip``) and the client's
    cert.pem/key.pem in ``directory``: Docker's layout (DOCKER_CERT_PATH)."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("budgethub test CA")
    ca = _issue("budgethub test CA", ca_key, ca_name, ca_key, ca=True)
    pem = serialization.Encoding.PEM
    (directory / "ca.pem").write_bytes(ca.public_bytes(pem))
    for prefix, subject, usage, ip in (
        ("server-", server_ip, ExtendedKeyUsageOID.SERVER_AUTH, server_ip),
        ("", "budgethub hub", ExtendedKeyUsageOID.CLIENT_AUTH, None),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _issue(subject, key, ca_name, ca_key, usage=usage, ip=ip)
        (directory / f"{prefix}cert.pem").write_bytes(cert.public_bytes(pem))
        _write_key(directory / f"{prefix}key.pem", key)


def _engine(*args: str, timeout: float = 180) -> str:
    done = subprocess.run(
        [str(ENGINE), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"scripts/engine {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    lines = done.stdout.strip().splitlines()
    return lines[-1] if lines else ""


@dataclass
class TlsNode:
    """A running TLS node: how to configure a Hub for it, and how to reach or kill it."""

    name: str
    url: str
    address: str
    """The namespace's end of the veth: where the engine and its sessions answer."""
    host_address: str
    """The host's end: where the Hub must listen for sessions on the node to reach it."""
    certs: Path

    @property
    def tls(self) -> dict[str, str]:
        """The node's ``tls`` entry in ``c.BudgetScheduler.nodes`` (the client's files)."""
        return {
            "ca": str(self.certs / "ca.pem"),
            "cert": str(self.certs / "cert.pem"),
            "key": str(self.certs / "key.pem"),
        }

    @property
    def hub_extra(self) -> str:
        """Hub configuration lines: the Hub listens where the namespace can reach it."""
        return f"c.JupyterHub.hub_ip = {self.host_address!r}\n"

    def node(self, name: str = "gpu-b", **extra: Any) -> dict[str, Any]:
        """A ``c.BudgetScheduler.nodes`` entry for a GPU node on this engine."""
        entry: dict[str, Any] = {
            "name": name,
            "pool": "gpu",
            "gpus": 1,
            "cpus": 8,
            "memory_gib": 16,
            "engine": self.url,
            "tls": self.tls,
            "address": self.address,
        }
        entry.update(extra)
        return entry

    def client(self, timeout: int = 30) -> docker.DockerClient:
        return docker_client(self.url, self.tls, timeout)

    def cli_env(self) -> dict[str, str]:
        """Environment for the docker CLI against this node (and unix for the local one)."""
        env = dict(os.environ)
        env.update(DOCKER_HOST=self.url, DOCKER_TLS_VERIFY="1", DOCKER_CERT_PATH=str(self.certs))
        return env

    @property
    def pid(self) -> int | None:
        try:
            return int((RUN_DIR / f"{self.name}.pid").read_text())
        except (OSError, ValueError):
            return None

    def kill(self) -> None:
        """SIGKILL the node's dockerd (its containers' shims live on in the namespace)."""
        pid = self.pid
        assert pid is not None, "the TLS node has no pid file"
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
            if state in ("Z", "X"):
                break
            time.sleep(0.1)

    def start(self) -> None:
        """Start (or restart, after ``kill``) the engine; a running one is left alone."""
        url = _engine("tls-node", self.name, "--tls", str(self.certs))
        assert url == self.url, (url, self.url)

    def copy_images(self, images: tuple[str, ...] = IMAGES) -> None:
        """docker save | docker load of the images the node lacks (by image id)."""
        local = docker.from_env()
        remote = self.client(timeout=300)
        try:
            need = []
            for tag in images:
                source = local.images.get(tag).id
                try:
                    if remote.images.get(tag).id == source:
                        continue
                except docker.errors.ImageNotFound:
                    pass
                need.append(tag)
            if not need:
                return
            local_env = dict(os.environ, DOCKER_HOST="unix:///var/run/docker.sock")
            save = subprocess.Popen(
                ["docker", "save", *need], stdout=subprocess.PIPE, env=local_env
            )
            loaded = subprocess.run(
                ["docker", "load", "-q"],
                stdin=save.stdout,
                capture_output=True,
                text=True,
                env=self.cli_env(),
                timeout=600,
                check=False,
            )
            assert save.stdout is not None
            save.stdout.close()
            saved = save.wait(timeout=60)
            if saved or loaded.returncode:
                raise RuntimeError(f"copying {need} to {self.url} failed: {loaded.stderr[-2000:]}")
        finally:
            local.close()
            remote.close()

    def containers(self, hub_name: str) -> list[Any]:
        client = self.client()
        try:
            return list(
                client.containers.list(all=True, filters={"label": f"org.budgethub.hub={hub_name}"})
            )
        finally:
            client.close()


def start_tls_node(name: str, certs: Path) -> TlsNode:
    """A fresh TLS node: leftovers of an earlier run purged, certificates made for the
    namespace's address, the engine started and the session images copied in."""
    why = netns_possible()
    if why is not None:
        raise NetnsUnavailable(why)
    _engine("stop-node", name, "--purge", timeout=120)
    host_address, address = _engine("netns", name).split()
    make_certificates(certs, address)
    url = _engine("tls-node", name, "--tls", str(certs))
    node = TlsNode(name, url, address, host_address, certs)
    node.copy_images()
    return node


def stop_tls_node(node: TlsNode) -> list[str]:
    """Purge the node: its dockerd, processes, namespace, veth, data; what was left over."""
    _engine("stop-node", node.name, "--purge", timeout=120)
    left = []
    if Path(f"/var/run/netns/bh-{node.name}").exists():
        left.append(f"network namespace bh-{node.name}")
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=30)
    if f"bht-{node.name}" in links.stdout:
        left.append(f"veth bht-{node.name}")
    if Path(f"/var/lib/budgethub/nodes/{node.name}").exists():
        left.append(f"/var/lib/budgethub/nodes/{node.name}")
    return left
