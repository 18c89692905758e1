"""Bad inputs through the CLI: the message each one gives and whether the run folder stayed untouched.

Every case builds its input in a temporary folder, runs ``fedxrisk run`` (in process,
with click's test runner), and records the exit code, the message the user sees
(the ``Error:`` line, or the traceback's last line when something crashed) and
whether the ``--out`` folder is exactly as before (absent stays absent, a
foreign folder keeps its files).

    python benchmarks/reliability/reliability_table.py               # run every case, write results + table
    python benchmarks/reliability/reliability_table.py --render-only # re-render the table from the JSON

Writes ``benchmarks/results/reliability.json`` and ``benchmarks/results/reliability.md``
(the table in docs/reliability.md). tests/test_reliability.py runs the same cases.
"""

from __future__ import annotations

import gzip
import hashlib
import struct
import sys
import tempfile
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports
from benchmarks.common import casetable  # noqa: E402
from benchmarks.common.casetable import message_cell  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
NAME = "reliability"
TINY = [
    "--rounds",
    "2",
    "--stages",
    "1",
    "--eval-every",
    "1",
    "--clients",
    "2",
    "--partition",
    "iid",
    "--imratio",
    "none",
]
TINY += ["--model", "linear", "--batch-size", "8", "--local-steps", "2", "--checkpoint-every", "1"]


@dataclass
class Case:
    """One bad input: ``build(tmp)`` writes its files and returns the CLI arguments (``--out`` added)."""

    id: str
    item: int
    what: str
    build: Callable[[Path], list[str]]
    out: str = "fresh"  # fresh: --out tmp/run (absent) | foreign: a user's folder | resume: --resume tmp/run
    runs: bool = False  # accepted with a warning: the run goes on (the folder is then written)


# -- input builders -----------------------------------------------------------
def _arrays(n_train: int = 60, n_test: int = 30, width: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "x_train": rng.normal(size=(n_train, width)).astype(np.float32),
        "y_train": (np.arange(n_train) % 3 == 0).astype(np.int64),
        "x_test": rng.normal(size=(n_test, width)).astype(np.float32),
        "y_test": (np.arange(n_test) % 3 == 0).astype(np.int64),
    }


def npz(change: Callable[[dict], None] | None = None) -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        arrays = _arrays()
        if change:
            change(arrays)
        np.savez(tmp / "data.npz", **arrays)
        return ["--dataset", "npz", "--data-dir", str(tmp / "data.npz"), *TINY]

    return build


def _set(key: str, index, value) -> Callable[[dict], None]:
    def change(a: dict) -> None:
        a[key] = a[key].astype(type(value)) if isinstance(value, float) else a[key]
        a[key][index] = value

    return change


def tabular(text: str, encoding: str = "utf-8") -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        (tmp / "tab").mkdir()
        (tmp / "tab" / "data.csv").write_bytes(text.encode(encoding))
        return ["--dataset", "tabular", "--data-dir", str(tmp / "tab"), *TINY]

    return build


def _csv(rows: int = 40, bad: dict[int, str] | None = None, header: str = "a,b,label") -> str:
    lines = [header]
    for r in range(rows):
        lines.append((bad or {}).get(r, f"{r % 7 * 0.5},{r % 5 - 2.0},{int(r % 3 == 0)}"))
    return "\n".join(lines) + "\n"


def idx_images(mutate: Callable[[Path], None], float_nan: bool = False) -> Callable[[Path], list[str]]:
    """MNIST-style IDX files (gzipped), 40 train and 20 test 4×4 images, then ``mutate(folder)``."""

    def idx(array: np.ndarray, code: int, dtype: str) -> bytes:
        head = bytes([0, 0, code, array.ndim]) + np.array(array.shape, dtype=">i4").tobytes()
        return head + array.astype(dtype).tobytes()

    def build(tmp: Path) -> list[str]:
        d = tmp / "mnist"
        d.mkdir()
        rng = np.random.default_rng(0)
        for prefix, n in (("train", 40), ("t10k", 20)):
            x = rng.integers(0, 255, size=(n, 4, 4))
            img = idx(x, 0x0D, ">f4") if float_nan else idx(x, 0x08, "u1")
            if float_nan and prefix == "train":
                arr = x.astype(">f4")
                arr[3, 1, 1] = np.nan
                arr[5, 0, 0] = np.inf
                img = idx(arr, 0x0D, ">f4")
            (d / f"{prefix}-images-idx3-ubyte.gz").write_bytes(gzip.compress(img))
            (d / f"{prefix}-labels-idx1-ubyte.gz").write_bytes(
                gzip.compress(idx(np.arange(n) % 10, 0x08, "u1"))
            )
        mutate(d)
        return ["--dataset", "mnist", "--data-dir", str(d), *TINY]

    return build


def _bad_deflate(d: Path) -> None:
    path = d / "train-images-idx3-ubyte.gz"
    raw = bytearray(path.read_bytes())
    raw[12:20] = b"\xff" * 8  # inside the first deflate block
    path.write_bytes(bytes(raw))


def _png(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width`` × ``height`` (the pixel data is one tiny row)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    pixels = zlib.compress(b"\0" * (1 + width) * min(height, 4))  # a bomb needs only its header
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def image_folder(bomb: bool) -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        for c in ("cat", "dog"):
            (tmp / "img" / c).mkdir(parents=True)
            for i in range(4):
                (tmp / "img" / c / f"{i}.png").write_bytes(_png(2, 1))
        if bomb:
            (tmp / "img" / "dog" / "huge.png").write_bytes(_png(30000, 30000))
        return ["--dataset", "folder", "--data-dir", str(tmp / "img"), *TINY]

    return build


def manifest_short_row(tmp: Path) -> list[str]:
    (tmp / "man").mkdir()
    (tmp / "man" / "a.png").write_bytes(_png(2, 1))
    rows = ["path,label"] + [f"a.png,{i % 2}" for i in range(6)]
    rows.insert(4, "a.png")
    (tmp / "man" / "manifest.csv").write_text("\n".join(rows) + "\n")
    return ["--dataset", "manifest", "--data-dir", str(tmp / "man"), *TINY]


def config_file(text: bytes, suffix: str = ".toml") -> Callable[[Path], list[str]]:
    def build(tmp: Path) -> list[str]:
        (tmp / f"cfg{suffix}").write_bytes(text)
        return ["--config", str(tmp / f"cfg{suffix}"), *TINY]

    return build


def flags(*args: str) -> Callable[[Path], list[str]]:
    return lambda tmp: [*TINY, *args]


def checkpoint(content: Callable[[bytes], bytes]) -> Callable[[Path], list[str]]:
    """A run killed after its first checkpoint, whose checkpoint.pt is then replaced by ``content(old)``."""

    def build(tmp: Path) -> list[str]:
        from fedxrisk.experiment import CHECKPOINT, run_experiment
        from fedxrisk.run.configfile import load_config

        cfg = load_config(None, ["experiment.rounds=3", "experiment.checkpoint_every=1", "data.clients=2"])
        cfg.tensorboard = False
        stop = lambda row, done, total: (_ for _ in ()).throw(KeyboardInterrupt) if done == 2 else None
        try:
            run_experiment(cfg, tmp / "run", stop)
        except KeyboardInterrupt:
            pass
        path = tmp / "run" / CHECKPOINT
        path.write_bytes(content(path.read_bytes()))
        return []

    return build


PRIVATE = ["--set", "privacy.clip=1.0"]


def init_from_integers(tmp: Path) -> list[str]:
    """The linear model's own keys and shapes, as int64 tensors."""
    import torch

    from fedxrisk.models import build_model

    state = build_model("linear", (4,), 0).state_dict()
    torch.save({k: v.round().to(torch.int64) for k, v in state.items()}, tmp / "int.pt")
    return [*npz()(tmp), "--set", f"model.init_from={str(tmp / 'int.pt')!r}"]


def damaged_summary(tmp: Path) -> list[str]:
    """A finished run (model.pt written) whose summary.json was cut short."""
    (tmp / "run").mkdir()
    (tmp / "run" / "model.pt").write_bytes(b"model")
    (tmp / "run" / "summary.json").write_text('{"status": "compl')
    return []


CASES: list[Case] = [
    # 1. data lost
    Case("foreign-out", 1, "`--out` = a user's folder holding notes.txt and history.csv", flags(), "foreign"),
    # 3. tracebacks
    Case("lr-inf", 3, "`--lr inf`", flags("--lr", "inf")),
    Case("lr-inf-config", 3, "`lr = inf` in a config file", config_file(b"[algorithm]\nlr = inf\n")),
    Case(
        "window-growth-inf",
        3,
        "`--set algorithm.window_growth=inf`",
        flags("--set", "algorithm.window_growth=inf"),
    ),
    Case("device-tpu", 3, "`--device tpu`", flags("--device", "tpu")),
    Case(
        "config-latin1",
        3,
        "a config file in Latin-1 (not UTF-8)",
        config_file("# café\n[data]\nclients = 2\n".encode("latin-1")),
    ),
    Case(
        "out-under-file",
        3,
        "`--out` below a regular file",
        lambda tmp: (tmp / "file").write_text("x") and [*TINY],
        "under-file",
    ),
    Case("out-uncreatable", 3, "`--out /proc/fedxrisk-run` (cannot be created)", flags(), "proc"),
    # 4. data errors
    Case("idx-bad-deflate", 4, "IDX `.gz` with a corrupt deflate block", idx_images(_bad_deflate)),
    Case(
        "npz-width-mismatch",
        4,
        "`.npz`: x_train 4 columns, x_test 5",
        npz(lambda a: a.update(x_test=np.ones((30, 5), np.float32))),
    ),
    Case(
        "npz-1d-x",
        4,
        "`.npz` with 1-D x_train / x_test",
        npz(lambda a: a.update(x_train=a["x_train"][:, 0], x_test=a["x_test"][:, 0])),
    ),
    Case("image-bomb", 4, "an image whose header declares 30000×30000", image_folder(bomb=True)),
    # 5. corrupt checkpoints
    Case(
        "ckpt-random",
        5,
        "`--resume` with checkpoint.pt = random bytes",
        checkpoint(lambda b: np.random.default_rng(0).bytes(len(b))),
        "resume",
    ),
    Case(
        "ckpt-truncated",
        5,
        "`--resume` with checkpoint.pt cut in half",
        checkpoint(lambda b: b[: len(b) // 2]),
        "resume",
    ),
    Case("ckpt-empty", 5, "`--resume` with an empty checkpoint.pt", checkpoint(lambda b: b""), "resume"),
    # 6. nonsense settings
    Case("lr-nan", 6, "`--lr nan`", flags("--lr", "nan")),
    Case("lr-decay-nan", 6, "`--lr-decay nan`", flags("--lr-decay", "nan")),
    Case("seed-negative", 6, "`--seed -1`", flags("--seed", "-1")),
    Case("dirichlet-nan", 6, "`--dirichlet-alpha nan`", flags("--dirichlet-alpha", "nan")),
    Case(
        "clients-per-rank-vmap",
        6,
        "`--clients-per-rank foo` with the vmap engine",
        flags("--clients-per-rank", "foo"),
    ),
    Case(
        "positive-classes-empty",
        6,
        "`--set data.positive_classes=[]`",
        flags("--set", "data.positive_classes=[]"),
    ),
    Case(
        "batch-too-large",
        6,
        "`--batch-size 100000` (shards of ~600 samples): capped, with a warning",
        flags("--batch-size", "100000"),
        runs=True,
    ),
    # 7. data validation
    Case("npz-nan", 7, "`.npz`: 3 NaN in x_train", npz(_set("x_train", (slice(0, 3), 1), np.nan))),
    Case("npz-inf-test", 7, "`.npz`: inf in x_test", npz(_set("x_test", (4, 0), np.inf))),
    Case("csv-nan", 7, "tabular CSV: a `nan` feature", tabular(_csv(bad={5: "nan,1.0,0"}))),
    Case(
        "idx-float-nan",
        7,
        "float IDX images with NaN and inf pixels",
        idx_images(lambda d: None, float_nan=True),
    ),
    Case("y-test-half", 7, "`.npz`: y_test = 0.5 in one row", npz(_set("y_test", 2, 0.5))),
    Case(
        "csv-no-features", 7, "tabular CSV with only a `label` column", tabular("label\n" + "0\n1\n0\n" * 10)
    ),
    Case("test-one-class", 7, "`.npz`: every y_test is 0", npz(lambda a: a["y_test"].fill(0))),
    Case("stray-label", 7, "`.npz`: one label 7 in 0/1 data", npz(_set("y_train", 10, 7))),
    Case(
        "npz-empty-train",
        7,
        "`.npz` with 0 training rows",
        npz(lambda a: a.update(x_train=a["x_train"][:0], y_train=a["y_train"][:0])),
    ),
    Case(
        "npz-zero-bytes",
        7,
        "a 0-byte `.npz`",
        lambda tmp: (
            (tmp / "data.npz").write_bytes(b"")
            or ["--dataset", "npz", "--data-dir", str(tmp / "data.npz"), *TINY]
        ),
    ),
    Case(
        "npz-string-x",
        7,
        "`.npz` with strings in x_train",
        npz(lambda a: a.update(x_train=np.full((60, 4), "high"))),
    ),
    Case("csv-label-negative", 7, "tabular CSV with label −1", tabular(_csv(bad={3: "1.0,2.0,-1"}))),
    Case(
        "csv-latin1", 7, "tabular CSV in Latin-1 (not UTF-8)", tabular(_csv(header="a,café,label"), "latin-1")
    ),
    Case("manifest-short-row", 7, "a manifest row with fewer fields than the header", manifest_short_row),
    # issue 34: settings that trained to the end and then lost the run, or did nothing silently
    Case(
        "privacy-sigma-zero",
        34,
        "`privacy.noise_multiplier = 0` (ε = ∞)",
        flags(*PRIVATE, "--set", "privacy.noise_multiplier=0"),
    ),
    Case(
        "privacy-fixed-no-client",
        34,
        "fixed DP sampling at q = 0.01 of 2 clients (0 per round)",
        flags(
            *PRIVATE,
            "--set",
            "privacy.noise_multiplier=1",
            "--set",
            "privacy.sampling='fixed'",
            "--set",
            "privacy.sampling_rate=0.01",
        ),
    ),  # fmt: skip
    Case(
        "csv-duplicate-column",
        34,
        "tabular CSV with the column name `a` twice",
        tabular(_csv(header="a,a,label")),
    ),
    Case("init-from-integers", 34, "`--init-from` a state dict of integer tensors", init_from_integers),
    Case(
        "reset-head-alone",
        34,
        "`model.reset_head = true` without `init_from`",
        flags("--set", "model.reset_head=true"),
    ),
    Case(
        "resume-damaged-summary",
        34,
        "`--resume` a finished run whose summary.json is not JSON",
        damaged_summary,
        "resume",
    ),
]


# -- running ------------------------------------------------------------------
def _snapshot(folder: Path) -> dict[str, str] | None:
    """File → content hash, or None when the folder does not exist."""
    if not folder.is_dir():
        return None
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def message_of(result, tmp: Path) -> str:
    """The line the user sees: click's ``Error: …`` line, our ``error: …`` line, or the crash."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        e = result.exception
        text = f"crash: {type(e).__name__}: {e}".splitlines()[0]
    else:
        lines = [ln.strip() for ln in result.output.splitlines() if ln.strip()]
        errors = [i for i, ln in enumerate(lines) if ln.lower().startswith(("error", "warning"))]
        first = errors[0] if errors else 0
        text = lines[first] if lines else ""
        if len(lines) > first + 1 and text.endswith(":"):  # a layout follows on the next lines
            text += " …"
    return text.replace(str(tmp.resolve()), "TMP").replace(str(tmp), "TMP")


def run_case(case: Case, tmp: Path) -> dict:
    """Build the case in ``tmp``, run it through the CLI; exit code, message, folder untouched."""
    from click.testing import CliRunner

    from fedxrisk.cli import main

    args = case.build(tmp)
    out = {"fresh": tmp / "run", "foreign": tmp / "mine", "resume": tmp / "run"}.get(case.out)
    if case.out == "under-file":
        out = tmp / "file" / "run"
    elif case.out == "proc":
        out = Path("/proc/fedxrisk-run")
    if case.out == "foreign":
        out.mkdir()
        (out / "notes.txt").write_text("my notes\n")
        (out / "history.csv").write_text("keep me\n")
    before = _snapshot(out)
    cli = (
        ["run", "--resume", str(out), "-q"]
        if case.out == "resume"
        else ["run", *args, "--out", str(out), "-q"]
    )
    with warnings.catch_warnings(record=True) as caught:  # as the user's stderr would show them
        warnings.simplefilter("always")
        result = CliRunner().invoke(main, cli)
    shown = [f"Warning: {w.message}" for w in caught if issubclass(w.category, UserWarning)]
    return {
        "id": case.id,
        "item": case.item,
        "input": case.what,
        "exit": result.exit_code,
        "message": message_of(result, tmp) if result.exit_code or not shown else shown[0],
        "untouched": _snapshot(out) == before,
        "runs": case.runs,
    }


def run_all(cases: list[Case] = CASES) -> list[dict]:
    rows = []
    for case in cases:
        with tempfile.TemporaryDirectory() as d:
            rows.append(run_case(case, Path(d)))
        print(f"{rows[-1]['exit']}  {case.id}: {rows[-1]['message']}", file=sys.stderr)
    return rows


def render(rows: list[dict]) -> str:
    lines = [
        "| issue item | bad input | exit | message the user sees | run folder untouched |",
        "|---:|---|---:|---|:---:|",
    ]
    for r in rows:
        code = message_cell(r["message"])
        lines.append(
            f"| {r['item']} | {r['input']} | {r['exit']} | {code} | {'runs (warning)' if r.get('runs') else 'yes' if r['untouched'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    casetable.main(NAME, __doc__, run_all, render)


if __name__ == "__main__":
    main()
