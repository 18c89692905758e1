"""benchmarks/timing/peers.py (issue 43 item 4): its refusal when a peer is missing and its tables."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root: `benchmarks.*`
from benchmarks.timing import peers  # noqa: E402


def test_a_missing_peer_is_refused_in_one_line_naming_the_pip_command(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "timing" / "peers.py"), "--pfl-python", str(tmp_path / "none"), "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install" in lines[0], out.stderr
    assert not list(tmp_path.glob("peers.*"))  # nothing written


def _run(framework: str, k: int, m: int, rps: float, pss: float, **extra) -> dict:
    return {
        "framework": framework, "clients": k, "per_round": m, "rounds_per_s": rps, "first_rounds_s": 1.0,
        "setup_s": 1.0, "process_s": 2.0, "peak_rss_mb": pss, "peak_pss_mb": pss, "processes": 1,
        "final_loss": 0.6, **extra,
    }  # fmt: skip


def test_the_ratios_are_fedxrisk_over_the_peer_of_the_same_k_and_m():
    res = {
        "per_client": 32, "rounds": 10, "warmup": 2, "machine": "m", "load_before": 1.0, "load_after": 1.0,
        "versions": {"flwr": "1", "ray": "2", "pfl": "0.6", "torch": "2"},
        "runs": [
            _run("fedxrisk", 1000, 100, 4.0, 500.0, rss_stages_mb={"built": 450.0}, state_mb=48.4),
            _run("pfl", 1000, 100, 2.5, 300.0),
            _run("fedxrisk", 100, 100, 16.0, 350.0, control=True),
        ],
    }  # fmt: skip
    text = peers.render(res)
    assert "| 1,000 | 100 | pfl | 2.50 | **1.6×** |" in text
    assert "0.6×" in text  # pfl's PSS / fedxrisk's
    assert "| 100 | 100 | fedxrisk (control: every client) | 16.00 | — |" in text
    assert "| 1,000 | fedxrisk | nan | nan | nan | 450 | nan | nan | 48.4 |" in text
