"""Alias of the run layer's public names, kept for scripts and docs written against
``fedxrisk.experiment`` (the module that held them before :mod:`fedxrisk.run`); new code
imports from :mod:`fedxrisk.run` or from :mod:`fedxrisk` itself."""

from fedxrisk.errors import ConfigError
from fedxrisk.run.build import Setup, build, build_data
from fedxrisk.run.checks import validate
from fedxrisk.run.folder import (
    CHECKPOINT,
    HISTORY_FIELDS,
    RunResult,
    default_out_dir,
    json_safe,
    load_checkpoint,
    load_model,
    load_run,
    save_checkpoint,
    write_json_atomic,
)
from fedxrisk.run.recipes import resume_experiment, run_experiment
from fedxrisk.run.spec import DEFAULT_LOCAL_STEPS, RunConfig

__all__ = [
    "CHECKPOINT", "DEFAULT_LOCAL_STEPS", "HISTORY_FIELDS", "ConfigError", "RunConfig", "RunResult", "Setup",
    "build", "build_data", "default_out_dir", "json_safe", "load_checkpoint", "load_model", "load_run",
    "resume_experiment", "run_experiment", "save_checkpoint", "validate", "write_json_atomic",
]  # fmt: skip
