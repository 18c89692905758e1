"""Tables at 80 columns (a narrow terminal or a pipe): no line wider, no value cut or split."""

from __future__ import annotations

import io

from rich.console import Console

from fedxrisk.cli import run as cli_run
from fedxrisk.compare import display_rows
from fedxrisk.tables import fit_table


def _rows(labels):
    return [
        dict(variant=v, final_test_auroc_mean=0.96321, final_test_auroc_std=0.00404, selected_test_auroc_mean=0.97,
             selected_test_auroc_std=0.0031, final_test_ap_mean=0.95, final_test_ap_std=0.0123, rounds=100,
             bytes_up_per_client=3456000, bytes_down_per_client=3456000, completed=3, seeds=3)
        for v in labels
    ]  # fmt: skip


def _render(table, width):
    console = Console(file=io.StringIO(), width=width)
    console.print(table)
    return console.file.getvalue()


def test_the_comparison_fits_80_columns_with_every_value_whole():
    header, cells = display_rows(_rows(["codasca", "codaplus eta_g=1.1 I=32", "localsgdm"]))
    text = _render(fit_table("comparison: variants", header, cells, 80), 80)
    assert max(map(len, text.splitlines())) <= 80 and "…" not in text
    for value in ("0.9632", "± 0.0040", "0.9700", "± 0.0031", "± 0.0123", "6.912", "3/3", "100"):
        assert text.count(value) == 3, value
    for word in {w for h in header for w in h.split()}:
        assert word in text
    wide = _render(fit_table("comparison: variants", header, cells, 160), 160)
    assert wide.count("0.9632 ± 0.0040") == 3  # one line per cell when there is room


def test_the_run_summary_fits_80_columns(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    final = {"test_auroc": 0.951234, "test_ap": 0.9, "test_pauc30_mcclish": 0.8, "client_auroc_mean": 0.7}
    final["test_auroc_per_label"] = [0.912345, 0.823456, 0.734567, 0.645678, 0.556789]
    summary = {
        "algorithm": "localsgdm_rl", "dataset": "chestxray_ih", "num_clients": 16, "local_steps": 32,
        "rounds": 1000, "final": final, "selected": {"selection": "best", "monitor": "val_auroc", "value": 0.96, "round": 995,
                                                     "test_auroc": 0.9432},
        "communication": {"bytes_up_per_client": 123456789012, "bytes_down_per_client": 123456789012},
        "wall_seconds": 12345.678,
    }  # fmt: skip
    cli_run._print_summary(summary, "runs/x")
    text = capsys.readouterr().out
    assert max(map(len, text.splitlines())) <= 80 and "…" not in text
    for value in (
        "0.9512",
        "0.9123, 0.8235, 0.7346, 0.6457, 0.5568",
        "0.9600 (round 995)",
        "0.9432",
        "123,456,789,012",
    ):
        assert value in text, value
