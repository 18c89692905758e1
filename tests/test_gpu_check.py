"""benchmarks/timing/gpu_check.py, the GPU path's prepared script, kept working on a CPU-only machine."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks.*`

from benchmarks.timing import gpu_check  # noqa: E402


def test_the_equivalence_table_on_the_cpu(tmp_path):
    assert gpu_check.main(["--device", "cpu", "--engines", "vmap", "--no-speed", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "gpu_check.md").read_text()
    diffs = [float(d) for d in re.findall(r"\| vmap \| cpu \| ([0-9.e+-]+) \| yes \|", text)]
    assert len(diffs) == len(gpu_check.ALGORITHMS) and max(diffs) < 1e-6


def test_a_tolerance_breach_fails_the_check(tmp_path):
    args = ["--device", "cpu", "--engines", "vmap", "--tolerance", "-1", "--no-speed", "--out", str(tmp_path)]
    assert gpu_check.main(args) == 1  # no difference can be below −1: every row fails
    assert (tmp_path / "gpu_check.md").read_text().count("| NO |") == len(gpu_check.ALGORITHMS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
def test_cuda_without_a_device_is_one_line(capsys):
    assert gpu_check.main(["--device", "cuda", "--out", "unused"]) == 2
    assert "no CUDA device here" in capsys.readouterr().err
