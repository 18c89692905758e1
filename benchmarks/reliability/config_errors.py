"""docs/cli.md's config-error example: each command run, its one-line error recorded as printed.

python benchmarks/reliability/config_errors.py      # writes benchmarks/results/config_errors.md
"""

from __future__ import annotations

import shlex
from pathlib import Path

from click.testing import CliRunner

from fedxrisk.cli import main

OUT = (Path(__file__).resolve().parents[1] / "results") / "config_errors.md"
COMMANDS = (
    "fedxrisk run --set data.imratoi=0.2",
    "fedxrisk run --set experiment.rounds=2.5",
    "fedxrisk run --set algorithm.algorithm=localsgdm --set algorithm.momentum=1.5",
    "fedxrisk run --set data.positive_classes=[]",
)


def render() -> str:
    lines = ["```"]
    for command in COMMANDS:
        result = CliRunner().invoke(main, shlex.split(command)[1:], terminal_width=10_000)
        assert result.exit_code == 2, (command, result.output)
        lines += [f"$ {command}", " ".join(result.output.split())]
    return "\n".join([*lines, "```", ""])


if __name__ == "__main__":
    OUT.write_text(render())
    print(OUT)
