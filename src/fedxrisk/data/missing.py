"""Missing feature values of a tabular CSV (``data.on_missing``), handled where the data lives.

A cell is missing when it is blank, ``?``, ``NA``, ``N/A``, ``null`` or ``nan`` (any case). The
reader reads such a cell as NaN and :func:`apply_missing` then, by the policy:

- ``error`` (default): one line naming the column(s) and counting the rows, with the way out;
- ``drop_rows``: rows (training and test) with a missing feature are left out;
- ``drop_columns``: feature columns with a missing value anywhere are left out;
- ``impute``: each site fills its own missing values with the mean of **its own training rows**
  in that column (the source column's site; one site without it), test rows with their site's
  training mean. No raw value crosses a site. Where a site observed none of a column, its
  missing values become the column's training mean over the other sites' means, weighted by
  their counts — the same pooled statistic the reader already standardizes every feature with
  (a secure sum in a deployment), so the feature then carries no information there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from fedxrisk.errors import DataFileError

if TYPE_CHECKING:
    from fedxrisk.data.types import LabeledData

MISSING_MARKERS = frozenset({"", "?", "na", "n/a", "null", "nan"})
POLICIES = ("error", "drop_rows", "drop_columns", "impute")
MISSING_DATASETS = ("tabular",)  # the readers taking on_missing (heart_disease drops as FLamby does)


def is_missing(cell: str) -> bool:
    """Whether a CSV cell holds no value (see the module doc)."""
    return cell.strip().lower() in MISSING_MARKERS


def apply_missing(data: LabeledData, names: list[str], policy: str, where: str) -> list[str]:
    """Handle the NaN features of ``data`` (in place) by ``policy``; the feature names kept."""
    if policy not in POLICIES:
        raise DataFileError(f"data.on_missing must be one of {', '.join(POLICIES)}, got {policy!r}")
    gaps = np.isnan(data.x_train).sum(0) + np.isnan(data.x_test).sum(0)
    if not gaps.any():
        return names
    if policy == "error":
        rows = len(data.x_train) + len(data.x_test)
        worst = np.argsort(-gaps, kind="stable")[: int((gaps > 0).sum())]
        shown = ", ".join(f"{names[j]!r} ({int(gaps[j])} of {rows} rows)" for j in worst[:3])
        more = f" and {len(worst) - 3} more column(s)" if len(worst) > 3 else ""
        raise DataFileError(
            f"{where}: missing values (blank, '?' or NA) in column(s) {shown}{more}; set data.on_missing "
            "to drop_rows, drop_columns or impute (docs/data.md)"
        )
    if policy == "drop_columns":
        keep = np.flatnonzero(gaps == 0)
        if not len(keep):
            raise DataFileError(
                f"{where}: every feature column has a missing value; nothing left to learn from"
            )
        data.x_train, data.x_test = data.x_train[:, keep], data.x_test[:, keep]
        return [names[j] for j in keep]
    if policy == "drop_rows":
        _drop_rows(data, where)
        return names
    _impute_per_site(data)
    return names


def _drop_rows(data: LabeledData, where: str) -> None:
    for split in ("train", "test"):
        x = getattr(data, f"x_{split}")
        keep = ~np.isnan(x).any(1)
        if not keep.any():
            raise DataFileError(
                f"{where}: every {split} row has a missing value; nothing left with drop_rows"
            )
        setattr(data, f"x_{split}", x[keep])
        setattr(data, f"y_{split}", getattr(data, f"y_{split}")[keep])
        groups = getattr(data, f"groups_{split}")
        for key in list(groups):
            groups[key] = np.asarray(groups[key])[keep]


def _impute_per_site(data: LabeledData) -> None:
    train_sites = data.groups_train.get("source", np.zeros(len(data.x_train), dtype=np.int64))
    test_sites = data.groups_test.get("source", np.zeros(len(data.x_test), dtype=np.int64))
    observed = ~np.isnan(data.x_train)
    sites = np.unique(train_sites)
    sums = np.stack([np.nansum(data.x_train[train_sites == s], 0) for s in sites])
    counts = np.stack([observed[train_sites == s].sum(0) for s in sites])
    fallback = sums.sum(0) / np.maximum(counts.sum(0), 1)  # the pooled mean: a secure sum
    means = np.where(counts > 0, sums / np.maximum(counts, 1), fallback)
    for x, at in ((data.x_train, train_sites), (data.x_test, test_sites)):
        _fill(x, at, sites, means, fallback)


def _fill(
    x: np.ndarray, at: np.ndarray, sites: Sequence[int], means: np.ndarray, fallback: np.ndarray
) -> None:
    """Each row's NaNs ← its site's training means (a site unseen in training: the pooled mean)."""
    lookup = {int(s): i for i, s in enumerate(sites)}
    for r in np.flatnonzero(np.isnan(x).any(1)):
        row = means[lookup[int(at[r])]] if int(at[r]) in lookup else fallback
        gap = np.isnan(x[r])
        x[r, gap] = row[gap]
