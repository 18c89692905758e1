"""One config, one check (issue 31 item 1): RunConfig is the only schema, every error at once,
the algorithm's declared checks, and programming errors that surface as themselves."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from fedxrisk.cli import main
from fedxrisk.cli.flags import flag_settings
from fedxrisk.errors import ConfigError
from fedxrisk.run import assemble as assemble_module
from fedxrisk.run.build import build
from fedxrisk.run.checks import check, checked
from fedxrisk.run.configfile import SECTIONS, config_to_sections
from fedxrisk.run.spec import SECTION_ORDER, RunConfig, settings

SRC = Path(__file__).resolve().parents[1] / "src" / "fedxrisk"
SETTINGS = settings()
# A file that still declares run settings of its own, and why it may for now.
SECOND_SCHEMAS = {
    "flower/config.py": "FlowerConfig; the flower branch replaces it by a serializer of RunConfig (issue 31)",
}
# Options of other commands that share a flag name with a run setting but are their own setting.
OWN_OPTIONS = {
    ("cli/evaluate.py", "seed"): "the bootstrap's seed",
    ("cli/evaluate.py", "device"): "the device evaluation runs on",
    ("cli/evaluate.py", "batch_size"): "images per evaluation batch",
    ("cli/predict.py", "device"): "the device prediction runs on",
    ("cli/predict.py", "batch_size"): "inputs per prediction batch",
    ("cli/tune.py", "seed"): "the sampler's seed (--seed search_seed)",
}
# Core classes below the run layer (they cannot import run/spec.py) whose constructors keep a
# default for a library user: each must equal RunConfig's, which the test asserts.
CORE_DEFAULTS = {
    "problem.py Problem.buffer_policy",
    "problem.py Problem.pos_ratio_mode",
    "problem.py Problem.personal",
    "data/stream_choice.py StreamChoice.on_bad_file",
}


def _literal(node: ast.AST | None) -> bool:
    """A constant default other than None / False (``-1``, ``0.5``, ``"mlp"`` …)."""
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    return isinstance(node, ast.Constant) and node.value not in (None, False)


def _option_dest(call: ast.Call) -> str | None:
    """The parameter a ``click.option("--flag", …)`` call fills."""
    names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    plain = [n for n in names if not n.startswith("-")]
    if plain:
        return plain[0]
    long = [n for n in names if n.startswith("--")]
    return long[0][2:].split("/")[0].replace("-", "_") if long else None


def second_defaults(root: Path = SRC) -> list[str]:
    """Every literal default of a run setting outside RunConfig: a click option filling a setting's
    name with ``default=<literal>``, or a class attribute ``name: T = <literal>`` named like one."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "run/spec.py" or rel in SECOND_SCHEMAS:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "option":
                dest = _option_dest(node)
                default = next((k.value for k in node.keywords if k.arg == "default"), None)
                if dest in SETTINGS and _literal(default) and (rel, dest) not in OWN_OPTIONS:
                    found.append(f"{rel}:{node.lineno} option {dest} default={ast.unparse(default)}")
            if isinstance(node, ast.ClassDef) and not rel.startswith("algorithms/"):
                for item in node.body:  # algorithms' fields are their hyperparameters, not run settings
                    if (
                        isinstance(item, ast.AnnAssign)
                        and isinstance(item.target, ast.Name)
                        and item.target.id in SETTINGS
                        and _literal(item.value)
                    ):
                        name, value = item.target.id, ast.literal_eval(item.value)
                        where = f"{rel} {node.name}.{name}"
                        if where not in CORE_DEFAULTS or value != SETTINGS[name].default:
                            found.append(f"{rel}:{item.lineno} {node.name}.{name} = {value!r}")
    return sorted(found, key=lambda f: (f.split(":")[0], int(f.split(":")[1].split()[0])))


@pytest.mark.slow  # over 0.9 s in the quick subset (issue 39: keep it under 3 min)
def test_no_run_setting_has_a_second_literal_default_in_src():
    assert second_defaults() == []


def test_the_scan_finds_a_second_default(tmp_path):
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "x.py").write_text(
        'import click\n@click.option("--rounds", type=int, default=100)\ndef f(rounds): ...\n'
        "class Other:\n    stages: int = 1\n"
    )
    (tmp_path / "problem.py").write_text("class Problem:\n    buffer_policy: str = 'local'\n")
    assert second_defaults(tmp_path) == [
        "cli/x.py:2 option rounds default=100",
        "cli/x.py:5 Other.stages = 1",
        "problem.py:2 Problem.buffer_policy = 'local'",  # a core default that drifted from RunConfig's
    ]


def test_sections_and_flags_are_read_from_the_fields():
    declared = {s.name: s.section for s in SETTINGS.values() if s.section is not None}
    assert {k: section for section, keys in SECTIONS.items() for k in keys} == declared
    assert tuple(SECTIONS) == SECTION_ORDER
    assert all(s.help for s in SETTINGS.values())
    flags = {s.flag: s.name for s in flag_settings()}
    assert len(flags) >= 25 and flags["--pos-ratio"] == "pos_ratio_mode" and flags["--clients"] == "clients"
    help_text = CliRunner().invoke(main, ["run", "--help"], terminal_width=200).output
    for s in flag_settings():
        assert s.flag in help_text
        if s.default not in (None, False):
            assert f"[default: {str(s.default).lower() if s.default is True else s.default}]" in help_text


def test_every_flag_sets_its_field(tmp_path, monkeypatch):
    """Each flag, typed with a value that is not its default, lands on its RunConfig field."""
    values = {"imratio": ("none", None), "lr": ("0.5", 0.5), "local_steps": ("3", 3), "clients": ("4", 4),
              "clients_per_rank": ("2", 2), "dist_timeout": ("60", 60.0), "data_dir": ("somewhere", "somewhere")}  # fmt: skip
    seen = {}

    def stop(doc):
        seen.update(doc)
        raise ConfigError("stop")

    monkeypatch.setattr("fedxrisk.run.configfile.config_from_sections", stop)
    for s in flag_settings():
        text, value = values.get(s.name, (None, None))
        if s.hint is bool:
            args, value = [s.flag], True
        elif text is None:
            default = s.default
            value = default * 2 if isinstance(default, (int, float)) else f"x{default}"
            args = [s.flag, str(value)]
        else:
            args = [s.flag, text]
        seen.clear()
        result = CliRunner().invoke(main, ["run", *args])
        assert result.exit_code == 2 and "Error: stop" in result.output, (s.name, result.output)
        assert seen[s.section][s.name] == value, s.name


BAD = """
[experiment]
rounds = "ten"
selection = "best"

[data]
imratio = 1.5
clients = 0
imratoi = 0.2

[algorithm]
algorithm = "fcsg_m"
beta = 2.0

[engine]
device = "tpu"
"""


def test_fedxrisk_check_lists_every_error_of_a_config(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(BAD)
    result = CliRunner().invoke(main, ["check", str(path), "--set", "data.workers=-1"])
    assert result.exit_code == 2
    assert result.output.splitlines() == [
        "Error: experiment.rounds: expected an integer, got 'ten' (str)",
        "Error: unknown key 'data.imratoi' (did you mean 'imratio'?); [data] allows: "
        + ", ".join(sorted(SECTIONS["data"])),
        "Error: data.imratio must lie in (0, 1), got 1.5",
        "Error: data.clients must be ≥ 1, got 0",
        "Error: data.workers must be between 0 (decode in the training process) and 64, got -1",
        "Error: experiment.selection = 'best' chooses on validation data: set data.validation (e.g. 0.2 or 'auto')",
        "Error: algorithm.beta must lie in (0, 1], got 2.0 (fcsg_m)",
        "Error: engine.device 'tpu' is not a torch device; use cpu, cuda, cuda:N or mps",
    ]
    run = CliRunner().invoke(main, ["run", "--config", str(path), "--out", str(tmp_path / "run")])
    assert run.exit_code == 2 and not (tmp_path / "run").exists()
    assert run.output.strip().splitlines() == result.output.splitlines()[:4] + result.output.splitlines()[5:]


def test_fedxrisk_check_of_a_good_config_prints_ok_and_what_differs(tmp_path):
    path = tmp_path / "good.toml"
    path.write_text('[algorithm]\nalgorithm = "CODA+"\nprox = 0.01\n[data]\nimratio = 0.2\n')
    result = CliRunner().invoke(main, ["check", str(path), "--set", "privacy.clip=1.0", "--set", "privacy.noise_multiplier=1.0"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "ok",
        "data.imratio = 0.2",
        'algorithm.algorithm = "codaplus"',
        "privacy.noise_multiplier = 1.0",
        "privacy.clip = 1.0",
        "algorithm.prox = 0.01",
    ]
    assert CliRunner().invoke(main, ["check"]).stdout == "ok\n"


def test_algorithm_options_are_checked_by_what_the_algorithm_declares():
    # FCSG-M's beta check sat behind an access to the problem: building with problem=None hid it
    errors = check(RunConfig(algorithm="fcsg_m", options={"beta": 2.0}))
    assert [str(e) for e in errors] == ["algorithm.beta must lie in (0, 1], got 2.0 (fcsg_m)"]
    from fedxrisk.algorithms import ALGORITHMS

    ALGORITHMS["fcsg_m"].check_values({"beta": 0.5})  # no problem needed, nothing built
    with pytest.raises(ValueError, match="momentum must lie in"):
        ALGORITHMS["localsgdm"].check_values({"momentum": 1.0})
    assert [str(e) for e in check(RunConfig(algorithm="coda", stages=1, rounds=4), thorough=True)] == [
        "coda needs stages ≥ 2: its restart from the average iterate and its closed-form α happen only at "
        "stage ends, so with stages = 1 it is exactly codaplus (set stages, e.g. --stages 3, or use "
        "--algorithm codaplus) (coda)"
    ]


def test_check_does_not_touch_the_config():
    cfg = RunConfig(rounds=0)
    before = dataclasses.asdict(cfg), dict(vars(cfg))
    assert len(check(cfg)) == 1 and len(check(cfg)) == 1
    assert (dataclasses.asdict(cfg), dict(vars(cfg))) == before
    with pytest.raises(ConfigError):
        checked(cfg)


def test_the_sections_round_trip_every_setting():
    cfg = RunConfig(  # to_dict leaves these out at their defaults
        personal="bn", finetune_steps=1, personal_monitor="worst", clients_per_round=2, participation="weighted",
        participation_seed=1,
    )  # fmt: skip
    doc = config_to_sections(cfg)
    assert set(doc) == set(SECTION_ORDER)
    assert {k for table in doc.values() for k in table} == {s.name for s in SETTINGS.values() if s.section}


TINY = dict(clients=2, rounds=1, stages=1, local_steps=1, eval_every=1, tensorboard=False, engine="loop")


def test_build_lets_a_bug_raise_and_keeps_the_users_errors_as_config_errors(monkeypatch):
    cfg = RunConfig(**TINY)
    with pytest.raises(ConfigError, match="clients but only"):  # the user's: more clients than samples
        build(RunConfig(**{**TINY, "clients": 100_000}))

    def broken_problem(*args, **kwargs):
        raise ValueError("a bug in Problem")

    monkeypatch.setattr(assemble_module, "Problem", broken_problem)  # the one assembly
    with pytest.raises(ValueError, match="a bug in Problem") as caught:
        build(cfg)
    assert not isinstance(caught.value, ConfigError)

    def broken_model(*args, **kwargs):
        raise TypeError("a bug in build_model")

    monkeypatch.setattr(assemble_module, "build_model", broken_model)
    with pytest.raises(TypeError, match="a bug in build_model"):
        build(cfg)


def test_the_python_api_gets_the_type_checks_of_the_config_file():
    import numpy as np

    assert check(RunConfig(rounds=np.int64(3), stages=1, lr=np.float64(0.5))) == []  # a search's numbers
    assert [str(e) for e in check(RunConfig(rounds="3", options={"eta_g": "x"}))] == [
        "experiment.rounds: expected an integer, got '3' (str)",
        "algorithm.eta_g: expected a number, got 'x' (str)",
    ]


def test_every_algorithm_checks_its_values_without_a_problem():
    """check_hyperparameters reads the fields alone: every registered algorithm's defaults pass with
    no problem at all, and a bad value of each numeric knob below is refused the same way."""
    from fedxrisk.algorithms import ALGORITHMS
    from fedxrisk.schedule import Schedule

    for cls in ALGORITHMS.values():
        plan = Schedule.build(100, cls.fixed_window or 8, cls.default_lr, 3, 3.0, 1.0)
        cls.check_values({}, plan)  # the defaults of a default run: nothing raised, nothing built
    for name, key, bad in [("codasca", "eta_g", 0.0), ("fedprox", "mu", -1.0), ("fedxl2", "gamma", 2.0),
                           ("localsgdm_rl", "round_batch_size", 0), ("fedxl1", "tau", 0)]:  # fmt: skip
        with pytest.raises(ValueError, match=key):
            ALGORITHMS[name].check_values({key: bad})
        assert [e for e in check(RunConfig(algorithm=name, options={key: bad})) if key in str(e)], name


def _outside(allowed) -> list:
    """Values just outside what a declaration allows (run/spec.py Allowed), and a non-finite one."""
    if allowed.choices is not None:
        return ["no-such-choice"]
    out = [float("inf")] if allowed.finite else []
    if allowed.above is not None:
        out.append(allowed.above)
    if allowed.at_least is not None:
        out.append(allowed.at_least - 1)
    if allowed.below is not None:
        out.append(allowed.below)
    return out


CONTEXT = {"image_size": {"dataset": "folder"}}  # where the setting applies: no second refusal
DECLARED = [(name, value) for name, s in SETTINGS.items() if s.allowed for value in _outside(s.allowed)]


@pytest.mark.parametrize(("name", "value"), DECLARED, ids=[f"{n}={v}" for n, v in DECLARED])
def test_each_declared_bound_refuses_the_value_beyond_it_in_one_line(name, value):
    """Every bound and choice a setting declares is checked: the value just beyond it is refused in
    one line naming the setting with its section, and nothing else is (the default passes)."""
    cfg = dataclasses.replace(RunConfig(), **{name: value}, **CONTEXT.get(name, {}))
    errors = [str(e) for e in check(cfg)]
    assert len(errors) == 1, errors
    assert f"{SETTINGS[name].section}.{name}" in errors[0] and "\n" not in errors[0], errors
    assert check(RunConfig()) == []


def test_the_declarations_cover_the_ranges_the_rules_once_checked_one_by_one():
    """The bounds that were one function each before the declarations (run/rules.py) are declared."""
    declared = {name for name, s in SETTINGS.items() if s.allowed}
    assert declared >= {
        "seed", "rounds", "eval_every", "checkpoint_every", "early_stopping", "imratio", "clients",
        "dirichlet_alpha", "test_imratio", "batch_size", "lr", "stages", "finetune_steps", "lr_decay",
        "window_growth", "dist_timeout", "algorithm", "dataset", "partition", "model", "engine",
        "buffer_policy", "pos_ratio_mode", "selection", "personal_monitor", "personal", "image_size",
    }  # fmt: skip
