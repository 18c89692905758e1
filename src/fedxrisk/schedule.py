"""Stage schedules as data: learning rate and communication window per stage.

The papers' algorithms are stage-wise (CoDA, CODA+, CODASCA: the step size is
divided by a factor every T0 iterations, the window I may grow). A schedule is
a list of :class:`Stage`; engines iterate over its rounds.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    rounds: int
    window: int  # local steps between communications (I_s)
    lr: float  # step size of the stage (η_s)


@dataclass(frozen=True)
class RoundPlan:
    """Where one communication round sits in the schedule."""

    round: int  # 0-based round index
    stage: int
    window: int
    lr: float
    first_step: int  # global index of the round's first local step
    stage_start: bool  # first round of its stage
    stage_end: bool  # last round of its stage (stage transition happens in communicate)


@dataclass(frozen=True)
class Schedule:
    stages: tuple[Stage, ...]

    @classmethod
    def build(
        cls,
        rounds: int,
        local_steps: int,
        lr: float,
        stages: int = 1,
        lr_decay: float = 3.0,
        window_growth: float = 1.0,
    ) -> Schedule:
        """``rounds`` rounds split evenly into ``stages`` stages.

        Stage s (0-based) uses lr / lr_decay**s and window round(I · window_growth**s),
        so each stage has the same number of rounds (CODASCA Theorem 2's setting).
        """
        if rounds < 1:
            raise ValueError(f"rounds must be ≥ 1, got {rounds}")
        if local_steps < 1:
            raise ValueError(f"local steps (window I) must be ≥ 1, got {local_steps}")
        if lr <= 0:
            raise ValueError(f"learning rate must be > 0, got {lr}")
        if not 1 <= stages <= rounds:
            raise ValueError(
                f"stages must lie in [1, rounds={rounds}], got {stages} (lower it: --stages N, or --set algorithm.stages=N)"
            )
        if not (1 <= lr_decay < math.inf and 1 <= window_growth < math.inf):
            raise ValueError("lr_decay and window_growth must be finite numbers ≥ 1")
        base, extra = divmod(rounds, stages)
        return cls(
            tuple(
                Stage(
                    rounds=base + (1 if s < extra else 0),
                    window=max(1, round(local_steps * window_growth**s)),
                    lr=lr / lr_decay**s,
                )
                for s in range(stages)
            )
        )

    @property
    def num_rounds(self) -> int:
        return sum(s.rounds for s in self.stages)

    @property
    def num_steps(self) -> int:
        return sum(s.rounds * s.window for s in self.stages)

    def plan(self) -> Iterator[RoundPlan]:
        r = step = 0
        for s, stage in enumerate(self.stages):
            for i in range(stage.rounds):
                yield RoundPlan(r, s, stage.window, stage.lr, step, i == 0, i == stage.rounds - 1)
                r += 1
                step += stage.window
