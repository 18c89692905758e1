"""The step sizes ``fedxrisk tune`` searches, measured (issue 33): does every AUC method converge
at the ends of its default lr range on label-skewed splits? And do the stored runs of the
default-stability table (stability.py) still rerun bit for bit on the current source?

For each AUC method the candidate ends are default / 10 (the low end of the catalogue's range)
and, for the high end, default × 10, × 3 and × 1 (the catalogue's ``default_lr``): every
candidate runs on ``RANGE_COLUMNS`` × ``RANGE_SEEDS`` with the lr set explicitly (no automatic
lowering) and everything else at the defaults; a high candidate is tried only while the larger
ones had a failed run (NaN, or an lr the algorithm refuses, e.g. LocalSCGDAM's α·η < 1).
:func:`stable_range` is then the low end and the largest high candidate with no failed run: the
range ``catalog.json`` → ``search_space.lr`` must hold (tests/test_heterogeneous_study.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# the hospitals and two label-skewed splits (the failures), one seed: ~9 CPU-minutes in all
RANGE_COLUMNS = ("heart source", "campaign dir0.5 K=16", "mammography dir0.1 K=4")
RANGE_SEEDS = (0,)
HIGH_FACTORS = (10.0, 3.0, 1.0)
VERIFY_COLUMNS = ("heart source",)  # seed 0 of every method, rerun


def lr_key(lr: float) -> str:
    return f"{lr:.6g}"


def catalogue_lr(method: str) -> tuple[float, float, float]:
    """(default_lr, low, high) of the method's default tune range as the catalogue holds it now."""
    from fedxrisk.catalog import load

    entry = load()["algorithms"][method]
    lr = entry["search_space"]["lr"]
    return float(entry["default_lr"]), float(lr["low"]), float(lr["high"])


def candidates(method: str) -> tuple[float, list[float]]:
    """(the low end, the high candidates from the largest)."""
    from fedxrisk.catalog import LR_SPAN, load

    default = float(load()["algorithms"][method]["default_lr"])
    return default / LR_SPAN, [float(f"{default * f:.6g}") for f in HIGH_FACTORS]


def _nan(runs: list[dict[str, Any]]) -> int:
    """Runs that failed: a non-finite loss, or a step size the algorithm refuses (LocalSCGDAM: α·η < 1)."""
    return sum(r["outcome"] in ("nan", "refused") for r in runs)


def _one_refusable(
    one: Callable[..., dict[str, Any]], method: str, changes: dict[str, Any], seed: int
) -> dict[str, Any]:
    from fedxrisk.errors import ConfigError

    try:
        return one(method, changes, seed)
    except ConfigError as e:
        return {"outcome": "refused", "error": str(e).splitlines()[0]}


def _complete(runs: list[dict[str, Any]], columns: list[str]) -> bool:
    return {(r["column"], r["seed"]) for r in runs} >= {(c, s) for c in columns for s in RANGE_SEEDS}


def run_ranges(results: dict[str, Any], methods: list[str], cols: dict[str, dict[str, Any]],
               one: Callable[..., dict[str, Any]], save: Callable[[], None]) -> None:  # fmt: skip
    """Fill ``results["ranges"][method][lr]`` with runs (column, seed, outcome, AUROC)."""
    columns = [c for c in RANGE_COLUMNS if c in cols]
    ranges = results.setdefault("ranges", {})
    for method in methods:
        low, highs = candidates(method)
        for lr in [low, *highs]:
            runs = ranges.setdefault(method, {}).setdefault(lr_key(lr), [])
            for col in columns:
                for seed in RANGE_SEEDS:
                    if any(r["column"] == col and r["seed"] == seed for r in runs) or (
                        lr != low and _nan(runs)
                    ):
                        continue  # done, or a high candidate already shown unstable
                    r = _one_refusable(one, method, {**cols[col], "lr": lr}, seed)
                    runs.append({"column": col, "seed": seed, **r})
                    print("range", method, lr, col, seed, r.get("outcome"), r.get("test_auroc"), flush=True)
                    save()
            if lr != low and _nan(runs) == 0:
                break  # the largest high end without a NaN run is found


def stable_range(results: dict[str, Any], method: str) -> tuple[float, float] | None:
    """(low, high): the low end and the largest high candidate whose runs were all finite; None when
    the runs are incomplete or the low end had a NaN run."""
    columns = [c for c in RANGE_COLUMNS if c in results["columns"]]
    runs = results.get("ranges", {}).get(method, {})
    low, highs = candidates(method)
    if not _complete(runs.get(lr_key(low), []), columns) or _nan(runs[lr_key(low)]):
        return None
    for lr in highs:
        done = runs.get(lr_key(lr), [])
        if _complete(done, columns) and _nan(done) == 0:
            return low, lr
    return None


def render_ranges(results: dict[str, Any]) -> list[str]:
    ranges = results.get("ranges", {})
    if not ranges:
        return []
    columns = [c for c in RANGE_COLUMNS if c in results["columns"]]
    lines = ["", f"Range ends (explicit lr, everything else default) on {', '.join(columns)} × seeds "
             f"{list(RANGE_SEEDS)}: failed runs (NaN, or refused by the algorithm) / runs, lowest final test AUROC; the stable range is what "
             "`fedxrisk tune` searches by default (catalog.json → search_space.lr; fedxrisk.catalog.LR_HIGH where ×10 failed).", "",
             "| method | default lr | lr tried: failed / runs (min AUROC) | stable range |", "|---|---|---|---|"]  # fmt: skip
    for method, by_lr in ranges.items():
        tried = []
        for lr, runs in sorted(by_lr.items(), key=lambda kv: float(kv[0])):
            ok = [r["test_auroc"] for r in runs if r["outcome"] == "ok"]
            refused = " refused" if any(r["outcome"] == "refused" for r in runs) else ""
            tried.append(f"{lr}: {_nan(runs)}/{len(runs)}{refused}" + (f" ({min(ok):.3f})" if ok else ""))
        rng = stable_range(results, method)
        text = f"{rng[0]:g} – {rng[1]:g}" if rng else "–"
        lines.append(f"| {method} | {catalogue_lr(method)[0]:g} | {'; '.join(tried)} | {text} |")
    return lines


def verify(
    results: dict[str, Any], cols: dict[str, dict[str, Any]], one: Callable[..., dict[str, Any]]
) -> list[str]:
    """Rerun seed 0 of every method on ``VERIFY_COLUMNS``; the cells whose outcome or final test
    AUROC differ from the stored ones (empty: the stored table reruns bit for bit)."""
    differ = []
    for method, row in results["cells"].items():
        for col in VERIFY_COLUMNS:
            stored = next((r for r in row.get(col, []) if r["seed"] == 0), None)
            if stored is None or col not in cols:
                continue
            new = one(method, cols[col], 0)
            same = new["outcome"] == stored["outcome"] and new.get("test_auroc") == stored.get("test_auroc")
            print(
                "verify",
                method,
                col,
                "equal" if same else f"DIFFERS {stored.get('test_auroc')} → {new.get('test_auroc')}",
                flush=True,
            )
            if not same:
                differ.append(f"{method} ({col})")
    return differ
