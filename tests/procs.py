"""Real processes for deployment tests: find an executable, a free port, stop a process tree, and a
Flower federation on 127.0.0.1 with TLS and SuperNode authentication (docs/flower.md, "What changes
for real sites"), its certificates and site keys made here with ``cryptography`` (a flwr dependency)."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from helpers import PROCESS_WAIT

HOST = "127.0.0.1"
SRC = Path(__file__).resolve().parents[1] / "src"


def exe(name: str) -> str:
    """``name`` next to this Python (a virtualenv's bin) or on PATH; skip the test if absent."""
    local = Path(sys.executable).with_name(name)
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} not found next to {sys.executable} or on PATH")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), deepest last."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    out, frontier = [], [pid]
    while frontier:
        frontier = [p for p, parent in parents.items() if parent in frontier]
        out += frontier
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_all(procs: Iterable[subprocess.Popen], timeout: float = 15.0) -> None:
    """SIGTERM ``procs`` and all their descendants (Flower detaches some), SIGKILL what is left."""
    procs = list(procs)
    pids = [p for proc in procs for p in (proc.pid, *descendants(proc.pid))]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.2)
        if not any(alive(p) for p in pids):
            return


# -- certificates and keys (docs/flower.md steps 1 and 2) --------------------------------------------
def make_certificates(folder: Path) -> None:
    """ca.crt; superlink.pem + superlink.key for IP:127.0.0.1, signed by the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

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
    pkcs8 = serialization.PrivateFormat.PKCS8
    (folder / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (folder / "superlink.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "superlink.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, pkcs8, serialization.NoEncryption())
    )


def make_site_key(folder: Path, name: str) -> Path:
    """An ECDSA P-384 key pair in OpenSSH format, as ``ssh-keygen -t ecdsa -b 384`` writes."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    (folder / name).write_bytes(private)
    (folder / f"{name}.pub").write_bytes(public + b"\n")
    return folder / name


# -- a federation ---------------------------------------------------------------------------------------
def toml_value(value) -> str:
    """A --run-config value: flwr's parser takes no escaped quotes, so JSON text goes in a literal string."""
    return f"'{value}'" if isinstance(value, str) and '"' in value else json.dumps(value)


class SecureFederation:
    """A SuperLink with TLS and ``--enable-supernode-auth``, its SuperNodes and the ``flwr`` CLI, each
    with a private ``FLWR_HOME`` and log file under ``root``; ``app`` is the Flower app folder."""

    def __init__(self, root: Path, app: Path):
        self.root, self.app, self.port = root, app, free_port()
        make_certificates(root)
        self.env = {
            **os.environ,
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1",
            "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
            # Flower starts flower-superexec and flwr-clientapp by name
            "PATH": os.pathsep.join([str(Path(exe("flower-superlink")).parent), os.environ.get("PATH", "")]),
        }
        self.cli_home = root / "cli-home"
        self.cli_home.mkdir()
        (self.cli_home / "config.toml").write_text(
            f'[superlink]\ndefault = "secure"\n\n[superlink.secure]\naddress = "{HOST}:{self.port}"\n'
            f'root-certificates = "{root / "ca.crt"}"\n'
        )  # TLS: no `insecure`
        self.procs: dict[str, subprocess.Popen] = {}
        self.nodes: list[str] = []  # the SuperNodes' names

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

    def logs(self) -> dict[str, str]:
        return {name: self.log(name)[-1500:] for name in self.procs}

    def flwr(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [exe("flwr"), *args], env={**self.env, "FLWR_HOME": str(self.cli_home)}, capture_output=True,
            text=True, timeout=PROCESS_WAIT, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def superlink(self, timeout: float = PROCESS_WAIT) -> None:
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
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.procs["superlink"].poll() is None, self.log("superlink")[-2000:]
            with socket.socket() as s:
                if s.connect_ex((HOST, self.port)) == 0:
                    return
            time.sleep(0.3)
        raise TimeoutError(f"the SuperLink never listened on {HOST}:{self.port} in {timeout} s")

    def register(self, name: str) -> Path:
        """A new site key, its public half registered with ``flwr supernode register``."""
        key = make_site_key(self.root, name)
        registered = self.flwr("supernode", "register", f"{key}.pub", "secure")
        assert registered.returncode == 0, registered.stdout + registered.stderr
        return key

    def supernode(self, name: str, key: Path, node_config: str) -> subprocess.Popen:
        self.nodes.append(name)
        return self.start(name, [exe("flower-supernode"), "--superlink", f"{HOST}:{self.port}",
                                 "--root-certificates", str(self.root / "ca.crt"), "--auth-supernode-private-key",
                                 str(key), "--host", HOST, "--port", str(free_port()), "--node-config", node_config])  # fmt: skip

    def submit(self, out: Path, **run_config) -> int:
        """``flwr run`` the app with these run-config overrides and ``out-dir=out``; the run id."""
        overrides = " ".join(f"{k}={toml_value(v)}" for k, v in {**run_config, "out-dir": str(out)}.items())
        submitted = self.flwr("run", str(self.app), "secure", "--run-config", overrides)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        return int(re.search(r"run (\d+)", submitted.stdout).group(1))

    def ended(self, out: Path | None = None) -> str | None:
        """Why no file will come any more, or None: the SuperLink exited, every SuperNode exited, or
        the spied ServerApp of the run writing ``out`` returned or raised (``tests/spy_serverapp.py``)."""
        if (code := self.procs["superlink"].poll()) is not None:
            return f"the SuperLink exited with status {code}"
        if self.nodes and all(self.procs[n].poll() is not None for n in self.nodes):
            return "every SuperNode exited: " + ", ".join(
                f"{n} ({self.procs[n].returncode})" for n in self.nodes
            )
        done = None if out is None else out.with_name(out.name + ".spy-done")
        if done is not None and done.exists():
            return f"the ServerApp ended without writing it: {done.read_text(errors='replace')[-3000:]}"
        return None

    def wait_file(self, path: Path, timeout: float, out: Path | None = None) -> None:
        """Until ``path`` exists: fails at once (with the processes' logs, stderr included) when
        :meth:`ended` says it never will, else after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while not path.exists():
            reason = self.ended(out)
            if reason is not None and not path.exists():
                pytest.fail(f"no {path}: {reason}; logs: {self.logs()}", pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(f"no {path} after {timeout} s; logs: {self.logs()}", pytrace=False)
            time.sleep(0.5)

    def wait_summary(self, out: Path, timeout: float) -> dict:
        self.wait_file(out / "summary.json", timeout, out)
        return json.loads((out / "summary.json").read_text())

    def stop(self) -> None:
        stop_all(self.procs.values())
