"""Reading what a spied Flower server received (``spy_serverapp.py``) and searching it for a site's
secrets **by value**: every number the replies hold, however packed — Flower arrays, config and
metric values, numpy or torch bytes inside them (fedxrisk's packets, SecAgg+'s vectors), JSON
text, and raw bytes read as float/int vectors — is compared with what each site must keep: its
scores, its per-class histograms (an affine image of them anywhere in a vector: scaled, shifted,
quantized), its moment shares, its counts and its own AUROC. A test states what it found in plain
words (``Leak``), so a deliberately leaky site must be reported and an honest one must not.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import spy_serverapp

SPY_FILE = Path(spy_serverapp.__file__)
MASK_RANGE = 2**32  # SecAgg+'s modulus in fedxrisk (fedxrisk.flower.secure.MODULUS)


def install_spy(app: Path) -> Path:
    """Ship the spying ServerApp in the app folder and make it the app's ServerApp component
    (the ClientApp is unchanged; the ServerApp under test is the folder's ``fedxrisk_app``)."""
    shutil.copy(SPY_FILE, app / SPY_FILE.name)
    pyproject = (app / "pyproject.toml").read_text()
    spied, n = re.subn(
        r'(?m)^serverapp = "fedxrisk_app:server_app"$', 'serverapp = "spy_serverapp:server_app"', pyproject
    )
    assert n == 1, pyproject
    (app / "pyproject.toml").write_text(spied)
    return app


def load_records(out_dir: Path) -> tuple[list[dict], list[dict]]:
    """(pushes, replies) the spied server recorded for the run writing ``out_dir``."""
    pushes, replies = [], []
    with open(spy_serverapp.spy_paths(out_dir)[0], "rb") as f:
        while True:
            try:
                item = pickle.load(f)
            except EOFError:
                break
            (pushes if "push" in item else replies).append(item.get("push", item.get("reply")))
    return pushes, replies


# -- every number a reply holds ---------------------------------------------------------------------
def _from_bytes(blob: bytes) -> Iterator[Any]:
    """What a byte string may hold: a numpy array, a torch-saved object, or else raw vectors."""
    try:
        loaded = np.load(io.BytesIO(blob), allow_pickle=False)
    except Exception:
        loaded = None
    if isinstance(loaded, np.ndarray):  # (a zip archive, as torch.save writes, loads as an NpzFile)
        yield loaded
        return
    try:
        import torch

        yield torch.load(io.BytesIO(blob), weights_only=True)
        return
    except Exception:
        pass
    for dtype in (np.float64, np.float32, np.int64, np.int32):
        size = np.dtype(dtype).itemsize
        for start in range(size):
            usable = (len(blob) - start) // size * size
            if usable:
                yield ("raw", np.frombuffer(blob[start : start + usable], dtype=dtype))


def numbers(value: Any, raw: bool = False) -> Iterator[tuple[np.ndarray, bool]]:
    """Every numeric vector inside ``value`` as (float64 vector, read from raw bytes)."""
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "raw":
        yield from numbers(value[1], raw=True)
    elif isinstance(value, dict):
        for v in value.values():
            yield from numbers(v, raw)
    elif isinstance(value, (list, tuple)):
        if value and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            yield np.asarray(value, dtype=np.float64), raw
        else:
            for v in value:
                yield from numbers(v, raw)
    elif isinstance(value, (bytes, bytearray)):
        for inner in _from_bytes(bytes(value)):
            yield from numbers(inner, raw)
    elif isinstance(value, str):
        try:
            yield from numbers(json.loads(value), raw)
        except ValueError:
            pass
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield np.array([value], dtype=np.float64), raw
    elif hasattr(value, "detach"):  # a torch tensor
        yield from numbers(value.detach().cpu().double().numpy(), raw)
    elif isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        with np.errstate(over="ignore", invalid="ignore"):
            yield value.astype(np.float64).ravel(), raw


def reply_numbers(reply: dict) -> Iterator[tuple[np.ndarray, bool]]:
    for group in ("arrays", "configs", "metrics"):
        yield from numbers(reply[group])


def looks_masked(v: np.ndarray) -> bool:
    """A long vector of integers spread uniformly over SecAgg+'s ring [0, 2³²) (16 buckets within
    ±50 % of their share): a masked vector, whose single entries carry nothing."""
    if (
        len(v) < 64
        or not np.all(np.isfinite(v))
        or np.any(v != np.floor(v))
        or v.min() < 0
        or v.max() >= MASK_RANGE
    ):
        return False
    share = np.bincount((v // (MASK_RANGE / 16)).astype(int), minlength=16) / (len(v) / 16)
    return bool(np.all((share > 0.5) & (share < 1.5)))


# -- the secrets -----------------------------------------------------------------------------------
def _correlations(a: np.ndarray, s: np.ndarray, sc: np.ndarray, fft: dict) -> np.ndarray:
    """Σ_i a[o + i]·sc[i] for every offset o: directly when small, else by FFT (``fft`` caches the
    transforms: ``a``'s under "a", each secret's under its id, for as long as ``s`` lives)."""
    n, m = len(a), len(sc)
    if (n - m + 1) * m <= 20_000_000:
        return np.lib.stride_tricks.sliding_window_view(a, m) @ sc
    size = 1 << int(np.ceil(np.log2(n + m)))
    if ("a", size) not in fft:
        fft["a", size] = np.fft.rfft(a, size)
    if (id(s), size) not in fft:
        fft[id(s), size] = np.fft.rfft(sc[::-1], size)
    return np.fft.irfft(fft["a", size] * fft[id(s), size], size)[m - 1 : n]


def affine_match(a: np.ndarray, s: np.ndarray, tol: float = 1e-9, fft: dict | None = None) -> int | None:
    """The offset of a window of ``a`` equal to α·s + β (α ≠ 0) to a relative residual ``tol``, or None.
    Window sums by cumulative sums; every candidate is confirmed directly."""
    n, m = len(a), len(s)
    sc = s - s.mean()
    ss = float(sc @ sc)
    if n < m or m < 3 or ss == 0:
        return None
    a = np.where(np.isfinite(a) & (np.abs(a) < 1e150), a, 0.0)
    a = a / max(1.0, float(np.abs(a).max()))
    c1, c2 = np.concatenate([[0.0], np.cumsum(a)]), np.concatenate([[0.0], np.cumsum(a * a)])
    wsum, wsq = c1[m:] - c1[:-m], c2[m:] - c2[:-m]
    var = wsq - wsum**2 / m  # Σ (a_w − mean)² per window
    residual = var - _correlations(a, s, sc, {} if fft is None else fft) ** 2 / ss
    for o in np.flatnonzero((var > 1e-30 * m) & (residual <= 1e-6 * var)):  # confirm each candidate
        w = a[o : o + m] - a[o : o + m].mean()
        alpha = float(w @ sc) / ss
        if alpha != 0 and float(np.sum((w - alpha * sc) ** 2)) <= tol * float(w @ w):
            return int(o)
    return None


@dataclass
class Site:
    """What one site must keep: ``vectors`` (found as an affine image anywhere), ``values``
    (non-integers found to 1e-9 relative), ``counts`` (integers found exactly)."""

    name: str
    vectors: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)


@dataclass
class Leak:
    site: str
    secret: str
    reply: int
    how: str

    def __str__(self) -> str:
        return f"{self.site}'s {self.secret} in reply {self.reply} ({self.how})"


def find_leaks(replies: list[dict], sites: list[Site]) -> list[Leak]:
    """Every secret of ``sites`` found in clear in ``replies``."""
    leaks: list[Leak] = []
    fft: dict = {}
    for r, reply in enumerate(replies):
        found: set[tuple[str, str]] = set()
        for v, raw in reply_numbers(reply):
            masked = looks_masked(v)
            for key in [k for k in fft if k[0] == "a"]:  # this vector's transforms; the secrets' stay
                del fft[key]
            finite = v[np.isfinite(v)]
            for site in sites:
                for name, s in site.vectors.items():
                    if (site.name, name) not in found and affine_match(v, s, fft=fft) is not None:
                        found.add((site.name, name))
                        leaks.append(Leak(site.name, name, r, f"a vector of {len(v)}"))
                if masked or raw:  # single entries of a masked vector or of raw bytes mean nothing
                    continue
                for name, s in site.values.items():
                    close = np.abs(finite[:, None] - s[None, :]) <= 1e-9 * np.maximum(1.0, np.abs(s))[None, :]
                    if (site.name, name) not in found and close.any():
                        found.add((site.name, name))
                        leaks.append(Leak(site.name, name, r, f"value {finite[close.any(axis=1)][0]!r}"))
                for name, c in site.counts.items():
                    if (site.name, name) not in found and np.any(finite == c):
                        found.add((site.name, name))
                        leaks.append(Leak(site.name, name, r, f"value {c}"))
    return leaks


def evaluation_site(name: str, y: np.ndarray, scores: list[np.ndarray], totals: np.ndarray) -> Site:
    """The secrets of one site of a federated evaluation (``python -m fedxrisk.flower evaluate``):
    its logits under each model (and their bins), its per-class histograms, its shares of the
    pooled moments (against the pooled ``totals``), its class counts and its own AUROC/variance."""
    from fedxrisk.stats import delong
    from fedxrisk.stats.federated import EVAL_BINS, EVAL_LIMIT, bin_index, placement_shares, site_histograms
    from fedxrisk.stats.histogram import logit_edges

    edges = logit_edges(EVAL_BINS, EVAL_LIMIT)
    y = np.asarray(y).astype(bool)
    site = Site(name)
    counts = site_histograms(y, scores, edges)
    for i, s in enumerate(scores):
        for c, cls in enumerate(("negatives'", "positives'")):  # from its first to its last filled bin:
            filled = np.flatnonzero(counts[i, c])  # any image of the whole row holds this part
            site.vectors[f"model {i} {cls} histogram"] = counts[i, c, filled[0] : filled[-1] + 1].astype(
                np.float64
            )
        bins = bin_index(s, edges).astype(np.float64)
        site.vectors[f"model {i} scores"], site.vectors[f"model {i} sorted scores"] = s, np.sort(s)
        site.vectors[f"model {i} score bins"], site.vectors[f"model {i} sorted bins"] = bins, np.sort(bins)
        site.values[f"model {i} scores"] = s
        alone = delong(y, s)
        site.values[f"model {i} AUROC and variance"] = np.array([alone.auroc, alone.variance])
    shares = placement_shares(totals, y, scores, edges)
    site.vectors["moment shares"] = shares
    site.values["moment shares"] = shares
    site.counts = {"rows": len(y), "positives": int(y.sum()), "negatives": int((~y).sum())}
    for key, v in site.values.items():  # an integer (0, 1) proves nothing: every reply holds some
        site.values[key] = v[np.isfinite(v) & (v != np.round(v))]
    site.vectors = {k: v for k, v in site.vectors.items() if np.ptp(v) > 0}
    assert min(site.counts.values()) >= 10, f"{name}: too few rows of a class to search for its counts"
    return site


def evaluation_files(
    root: Path, sizes: tuple[int, ...] = (53, 41)
) -> tuple[list[str], list[tuple[np.ndarray, np.ndarray]], list[dict]]:
    """Two linear models (``root/model0.pt``, ``model1.pt``) and a ``root/data-k/test.npz`` per site:
    (model paths, [(x, y)] per site, model states)."""
    import torch

    from fedxrisk.flower.config import FlowerConfig

    rng = np.random.default_rng(3)
    cfg = FlowerConfig.from_run_config({"model": "linear", "test-data": ""})
    paths, states, data = [], [], []
    for seed in (0, 1):
        model = cfg.build_model((4,))
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)))
        states.append({k: v.clone() for k, v in model.state_dict().items()})
        paths.append(str(root / f"model{seed}.pt"))
        torch.save(states[-1], paths[-1])
    for k, n in enumerate(sizes):
        x = rng.normal(size=(n, 4)).astype(np.float32)
        y = (x[:, 0] + x[:, 1] + rng.normal(size=n) > 0.3).astype(np.float32)
        (root / f"data-{k}").mkdir()
        np.savez(root / f"data-{k}" / "test.npz", x=x, y=y)
        data.append((x, y))
    return paths, data, states


def scores_of(states: list[dict], x: np.ndarray) -> list[np.ndarray]:
    """Each model's logits on ``x``, as a site computes them."""
    import torch

    from fedxrisk.flower.config import FlowerConfig

    cfg = FlowerConfig.from_run_config({"model": "linear", "test-data": ""})
    out = []
    for state in states:
        model = cfg.build_model((4,))
        model.load_state_dict(state)
        model.eval()
        with torch.no_grad():
            out.append(model(torch.from_numpy(x)).reshape(-1).double().numpy())
    return out


def evaluated_models(replies: list[dict]) -> list[dict]:
    """The global models the sites sent back at evaluations (public: the same on every site), in
    order, each once: the ``model`` group of fedxrisk's packets, as Flower arrays (``arrays.model``)
    or inside packet bytes (under SecAgg+)."""
    import torch

    found: list[dict] = []
    for reply in replies:
        if "arrays.model" in reply["arrays"]:
            found.append(
                {k: torch.from_numpy(np.array(a)) for k, a in reply["arrays"]["arrays.model"].items()}
            )
        for record in reply["configs"].values():
            for value in record.values():
                try:
                    packet = (
                        torch.load(io.BytesIO(value), weights_only=True) if isinstance(value, bytes) else None
                    )
                except Exception:
                    continue
                if isinstance(packet, dict) and packet.get("arrays", {}).get("model"):
                    found.append(packet["arrays"]["model"])
    models: list[dict] = []
    for model in found:
        if not any(all(torch.equal(model[k], m[k]) for k in model) for m in models):
            models.append(model)
    return models


def training_site(name: str, cfg: Any, site: Any, models: list[dict]) -> Site:
    """The secrets of one training site (a ``SiteData``) under the evaluated global ``models``: its
    validation logits, their bins and per-class histograms, its validation AUROC, its training
    AUROC, its validation and training counts. A score that equals a weight of the public models
    (the sites send the evaluated model back) is left out of the values: that is chance, not a leak."""
    import torch

    from fedxrisk.flower.wire import unflatten
    from fedxrisk.metrics import auroc, predict
    from fedxrisk.problem import Problem
    from fedxrisk.stats import score_histogram
    from fedxrisk.stats.histogram import logit_edges

    problem = Problem(cfg.build_model(site.input_shape), 0.5, cfg.run.buffer_policy, cfg.run.pos_ratio_mode)
    out = Site(name)
    y_val, y = site.y_val.numpy().astype(bool), site.y.numpy().astype(bool)
    for r, flat in enumerate(models):
        tree = unflatten({k: v.to(torch.float32) if v.is_floating_point() else v for k, v in flat.items()})
        s = predict(problem, tree["params"], tree["buffers"], site.x_val).astype(np.float64)
        counts = score_histogram(s, y_val)
        for c, cls in enumerate(("negatives'", "positives'")):
            filled = np.flatnonzero(counts[c])
            out.vectors[f"evaluation {r} {cls} validation histogram"] = counts[
                c, filled[0] : filled[-1] + 1
            ].astype(np.float64)
        out.vectors[f"evaluation {r} validation scores"] = s
        out.vectors[f"evaluation {r} sorted validation scores"] = np.sort(s)
        out.vectors[f"evaluation {r} validation score bins"] = np.searchsorted(logit_edges(), s).astype(
            np.float64
        )
        out.values[f"evaluation {r} validation scores"] = s
        train = predict(problem, tree["params"], tree["buffers"], site.x).astype(np.float64)
        out.values[f"evaluation {r} AUROCs"] = np.array([auroc(y_val, s), auroc(y, train)])
    out.counts = {
        "validation rows": len(y_val),
        "validation positives": int(y_val.sum()),
        "validation negatives": int((~y_val).sum()),
        "training rows": len(y),
        "training positives": int(y.sum()),
    }
    public = np.concatenate([v.double().numpy().ravel() for m in models for v in m.values()] or [[]])
    for key, v in out.values.items():  # a float32 score equals one of the public models' ~8,500
        v = v[np.isfinite(v) & (v != np.round(v))]  # weights by chance in ~4 % of runs: no secret
        chance = np.abs(v[:, None] - public[None, :]) <= 1e-9 * np.maximum(1.0, np.abs(v))[:, None]
        out.values[key] = v[~chance.any(axis=1)]
    out.vectors = {k: v for k, v in out.vectors.items() if np.ptp(v) > 0}
    return out
