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


def test_the_closing_table_names_the_server_optimizer_personalization_and_each_sites_model(
    monkeypatch, capsys
):
    monkeypatch.setenv("COLUMNS", "100")
    personal = {
        "site_auroc_0": 0.91,
        "site_global_auroc_0": 0.85,
        "site_auroc_1": 0.62,
        "site_global_auroc_1": 0.7,
        "personal_auroc_mean": 0.765,
        "global_site_auroc_mean": 0.775,
    }
    summary = {
        "algorithm": "localsgdm", "dataset": "heart_disease", "num_clients": 2, "local_steps": 8, "rounds": 40,
        "final": {"test_auroc": 0.8}, "selected": None, "personal": personal,
        "config": {"server": {"optimizer": "adam", "lr": 0.01}, "personal": "head", "finetune_steps": 5},
        "data": {"client_sites": ["cleveland", "va"]},
        "communication": {"bytes_up_per_client": 1, "bytes_down_per_client": 1}, "wall_seconds": 1.0,
    }  # fmt: skip
    cli_run._print_summary(summary, "runs/x")
    text = capsys.readouterr().out
    assert "localsgdm + server adam (lr 0.01) + personal head + fine-tuned 5 steps on heart_disease" in text
    assert "site 0 (cleveland) AUROC: deployed model / global" in text and "0.9100 / 0.8500" in text
    assert "site 1 (va)" in text and "0.6200 / 0.7000" in text
    assert "0.7650 (global model at the sites: 0.7750)" in text
