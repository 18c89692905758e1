"""The deployment path of docs/flower.md for real sites: TLS and SuperNode authentication.

One SuperLink with TLS (a CA and a server certificate made here with
``cryptography``, which flwr installs) and ``--enable-supernode-auth``; two
SuperNodes whose public keys were registered with ``flwr supernode register``
and one whose key was not. The registered sites train a short run to the end;
the unregistered one is refused; ``flwr log`` shows the ``[fedxrisk] round k/R``
lines the docs promise. One federation serves the module; every process it
starts (and their descendants: Flower detaches its SuperExec) is stopped at the end.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="needs the optional extra: pip install -e '.[flower]'")
from cryptography import x509  # noqa: E402 (a dependency of flwr)
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

from fedxrisk.flower.__main__ import write_app  # noqa: E402
from procs import HOST, exe, free_port, stop_all  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"
ROUNDS = 1
SETTINGS = {"algorithm": "localsgdm", "rounds": ROUNDS, "local-steps": 2, "batch-size": 8, "stages": 1}
SETTINGS |= {"eval-every": 1, "test-data": "digits", "partition": "iid", "imratio": 0.3, "min-nodes": 2}
WAIT = 600.0  # s; generous for a loaded 2-core machine


def _pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_certificates(folder: Path) -> None:
    """ca.crt; superlink.pem + superlink.key for IP:127.0.0.1, signed by the CA (docs/flower.md step 1)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    valid = {
        "not_valid_before": now - datetime.timedelta(minutes=5),
        "not_valid_after": now + datetime.timedelta(days=1),
    }
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "consortium CA")])
    ca = (
        x509.CertificateBuilder(subject_name=ca_name, issuer_name=ca_name, public_key=ca_key.public_key(),
                                serial_number=x509.random_serial_number(), **valid)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (
        x509.CertificateBuilder(subject_name=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)]),
                                issuer_name=ca_name, public_key=key.public_key(),
                                serial_number=x509.random_serial_number(), **valid)
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    (folder / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (folder / "superlink.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "superlink.key").write_bytes(_pem(key))


def make_site_key(folder: Path, name: str) -> Path:
    """An ECDSA P-384 key pair in OpenSSH format, as ``ssh-keygen -t ecdsa -b 384`` writes (step 2)."""
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    (folder / name).write_bytes(private)
    (folder / f"{name}.pub").write_bytes(public + b"\n")
    return folder / name


class SecureFederation:
    def __init__(self, root: Path):
        self.root, self.port = root, free_port()
        make_certificates(root)
        self.env = {
            **os.environ,
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1",
            "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
            "PATH": os.pathsep.join([str(Path(exe("flower-superlink")).parent), os.environ.get("PATH", "")]),
        }
        self.cli_home = root / "cli-home"
        self.cli_home.mkdir()
        (self.cli_home / "config.toml").write_text(
            f'[superlink]\ndefault = "secure"\n\n[superlink.secure]\naddress = "{HOST}:{self.port}"\n'
            f'root-certificates = "{root / "ca.crt"}"\n'
        )  # TLS: no `insecure`
        self.procs: dict[str, subprocess.Popen] = {}
        self.app = write_app(root / "app", SETTINGS)

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        (self.root / f"home-{name}").mkdir()
        with open(self.root / f"{name}.log", "w") as log:
            proc = subprocess.Popen(
                args, cwd=self.root, env={**self.env, "FLWR_HOME": str(self.root / f"home-{name}")},
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def flwr(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [exe("flwr"), *args], env={**self.env, "FLWR_HOME": str(self.cli_home)}, capture_output=True,
            text=True, timeout=180, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def superlink(self) -> None:
        certs = [
            "--ssl-ca-certfile",
            "ca.crt",
            "--ssl-certfile",
            "superlink.pem",
            "--ssl-keyfile",
            "superlink.key",
        ]
        self.start("superlink", [exe("flower-superlink"), *certs, "--enable-supernode-auth",
                                 "--disable-runtime-dependency-installation", "--host", HOST, "--port", str(self.port)])  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.procs["superlink"].poll() is None, self.log("superlink")[-2000:]
            with socket.socket() as s:
                if s.connect_ex((HOST, self.port)) == 0:
                    return
            time.sleep(0.3)
        raise TimeoutError("the SuperLink never listened")

    def supernode(self, name: str, key: Path, node_config: str) -> subprocess.Popen:
        return self.start(name, [exe("flower-supernode"), "--superlink", f"{HOST}:{self.port}",
                                 "--root-certificates", str(self.root / "ca.crt"), "--auth-supernode-private-key",
                                 str(key), "--host", HOST, "--port", str(free_port()), "--node-config", node_config])  # fmt: skip

    def stop(self) -> None:
        stop_all(self.procs.values())


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    fed = SecureFederation(tmp_path_factory.mktemp("flower-tls"))
    try:
        fed.superlink()
        for k in range(2):
            key = make_site_key(fed.root, f"site-{k}")
            registered = fed.flwr("supernode", "register", f"{key}.pub", "secure")
            assert registered.returncode == 0, registered.stdout + registered.stderr
            fed.supernode(f"site-{k}", key, f'dataset="digits" partition-id={k} num-partitions=2')
        fed.supernode(
            "intruder",
            make_site_key(fed.root, "intruder"),
            'dataset="digits" partition-id=0 num-partitions=2',
        )
        yield fed
    finally:
        fed.stop()


def test_registered_sites_train_over_tls_and_flwr_log_shows_the_rounds(federation):
    out = federation.root / "run"
    submitted = federation.flwr("run", str(federation.app), "secure", "--run-config", f'out-dir="{out}"')
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    deadline = time.monotonic() + WAIT
    while not (out / "summary.json").exists():
        assert time.monotonic() < deadline, {n: federation.log(n)[-1500:] for n in federation.procs}
        time.sleep(0.5)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed", summary["error"]
    assert summary["rounds"] == ROUNDS and summary["num_clients"] == 2  # the intruder never joined
    run_id = re.search(r"run (\d+)", submitted.stdout).group(1)
    logs = federation.flwr("log", run_id, "secure", "--show")
    for k in range(1, ROUNDS + 1):  # the lines docs/flower.md promises, where Flower keeps them
        assert f"[fedxrisk] round {k}/{ROUNDS}: train loss" in logs.stdout, logs.stdout[-3000:]


def test_a_supernode_with_an_unregistered_key_is_refused(federation):
    intruder = federation.procs["intruder"]
    intruder.wait(timeout=WAIT)
    assert intruder.returncode != 0, federation.log("intruder")[-2000:]  # it gives up: refused
    assert "[code: 2004] Failed to activate SuperNode." in federation.log("intruder")
    assert "No SuperNode found with the given public key" in federation.log("superlink")
