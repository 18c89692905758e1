"""``data.memory_budget`` for the whole training process: what each memory consumer may take.

A run's resident memory is, on top of what the process holds when training starts (the
interpreter, torch, the model, data kept in memory: :func:`resident_bytes`), the training
step's activations, the decoded batches in flight and, when evaluating, one chunk of
inputs with its forward pass. :func:`plan_memory` measures the model's bytes per sample
(:func:`activation_bytes`: one forward/backward of a few samples at the run's input size)
and sizes every consumer so that their sum stays within the budget: clients per batched
step (``vmap``/``compile`` engines), prefetch depth, evaluation chunk. A batch size whose
single client's step cannot fit is refused before training (:class:`BudgetError`).
"""

from __future__ import annotations

import copy
import ctypes
import os
import resource
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from fedxrisk.data.stream_choice import MAX_EVAL_BATCH

# Resident bytes per byte the probe counts (:func:`activation_bytes`): gradients, backward's
# temporaries, glibc's heap and the algorithm's own tensors (its loss, the gradient tree, vmap's
# batched copies). Measured with the small CNN, batch 32: RSS grew by 46 MB per training sample at
# 3×224×224 (2.3× the 19.9 MB saved for backward) and by 4.75 MB at 3×64×64 under vmap (2.9×);
# by 16 MB per evaluated sample at 224 (1.25× the 12.8 MB of its largest layer's input + output).
TRAIN_OVERHEAD = 3.0
EVAL_OVERHEAD = 1.5
# Kept free: a share of the budget (heap fragmentation) and at least the one-off growth of the
# first round (modules loaded on first use, vmap's and the DataLoader's buffers: ≈ 100 MB measured).
HEADROOM, HEADROOM_MIN = 0.1, 150_000_000
PROBE = (2, 4)  # samples of the two measured passes: the difference is the per-sample cost


class BudgetError(ValueError):
    """A setting the memory budget cannot honour (a user's error: one line, exit 2)."""


def resident_bytes() -> int:
    """This process's resident memory now (Linux ``/proc/self/statm``; elsewhere its peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # pragma: no cover - not Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _storage_bytes(tensors: Any, seen: set[int]) -> int:
    total = 0
    for t in tree_flatten(tensors)[0]:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


def _saved_bytes(model: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes of the tensors a training forward saves for backward (each storage once)."""
    seen: set[int] = set()
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += _storage_bytes(t, seen)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return total


def _layer_bytes(model: torch.nn.Module, x: torch.Tensor) -> int:
    """The largest input + output of one layer in a no-grad forward: what must coexist then."""
    largest = 0

    def hook(module: torch.nn.Module, args: Any, out: Any) -> None:
        nonlocal largest
        largest = max(largest, _storage_bytes(args, set()) + _storage_bytes(out, set()))

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return largest


def activation_bytes(model: torch.nn.Module, input_shape: tuple[int, ...]) -> tuple[int, int]:
    """(training, evaluation) bytes per sample of ``model`` at ``input_shape``: the tensors a
    forward saves for backward (training mode), and the largest layer input + output of a
    no-grad forward (eval mode), each from :data:`PROBE` samples to the larger probe, per added
    sample. Measured on a CPU copy, so the model itself (BatchNorm statistics included) is unchanged."""
    with torch.inference_mode(False), torch.enable_grad():  # whatever mode the caller is in
        probe = copy.deepcopy(model).cpu()
        small, large = (torch.rand(n, *input_shape) for n in PROBE)
        probe.train(True)
        train = _saved_bytes(probe, large) - _saved_bytes(probe, small)
        probe.train(False)
        evaluate = _layer_bytes(probe, large) - _layer_bytes(probe, small)
    del probe, small, large
    release_heap()
    step = PROBE[1] - PROBE[0]
    return max(1, train // step), max(1, evaluate // step)


def release_heap() -> None:
    """Give freed heap memory back to the system (glibc ``malloc_trim``; elsewhere nothing)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass


@dataclass
class MemoryPlan:
    """How the budget is shared (bytes; reported under ``data.stream.memory`` in summary.json)."""

    budget: int
    resident: int  # the process before training: interpreter, torch, model, data in memory
    train_sample: int  # resident bytes per training sample (measured × TRAIN_OVERHEAD)
    eval_sample: int  # resident bytes per evaluated sample (measured × EVAL_OVERHEAD, its input included)
    step_bytes: int  # one decoded training step: K clients × B samples of float32 input
    clients_per_step: int  # clients whose activations are alive at once (K: unchunked)
    prefetch: int  # steps each worker decodes ahead (streamed runs)
    eval_batch: int  # samples per evaluation forward pass

    def summary(self) -> dict[str, int]:
        """The plan without ``resident``, which differs from one process to the next."""
        return {k: v for k, v in asdict(self).items() if k != "resident"}


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def plan_memory(
    model: torch.nn.Module,
    input_shape: tuple[int, ...],
    budget: int,
    batch_size: int,
    clients: int,
    *,
    batched: bool,
    workers: int = 0,
    max_prefetch: int = 4,
    eval_setting: int | None = None,
) -> MemoryPlan:
    """Share ``budget`` among the process as it is now, the training step and the batches in
    flight, and one evaluation chunk (beside the training step's share, which the allocator keeps
    for the next round; prefetched training batches are held through both).

    ``batched``: the engine steps its ``clients`` at once (``vmap``/``compile``), so their
    activations coexist, unless chunked (``clients_per_step``); else one client at a time.
    ``workers``: decoding processes of a streamed run (0: none prefetched). Raises
    :class:`BudgetError` when one client's step of ``batch_size`` samples cannot fit."""
    numel = 1
    for d in input_shape:
        numel *= int(d)
    torch.func.grad(lambda t: t.sum())(torch.zeros(1))  # loads torch.func's modules (~70 MB) now
    resident = resident_bytes()  # before the probe, whose freed memory the allocator reuses
    train, evaluate = activation_bytes(model, input_shape)
    train_sample = int(TRAIN_OVERHEAD * train)
    eval_sample = int(EVAL_OVERHEAD * evaluate) + 4 * numel * (1 + 2 * workers)  # the chunks decoded ahead
    step = 4 * numel * batch_size * clients
    # what the steps may take: after the batch in use, one step per worker ahead, and HEADROOM
    keep = max(HEADROOM * budget, HEADROOM_MIN)
    free = int(budget - keep) - resident - step * (1 + workers)
    need = batch_size * train_sample
    if resident >= budget:
        raise BudgetError(
            f"data.memory_budget = {_gb(budget)} is less than this process takes before training "
            f"({_gb(resident)}: the interpreter, torch, the model, data held in memory); raise data.memory_budget"
        )
    if free < need:
        raise BudgetError(
            f"data.memory_budget = {_gb(budget)} cannot hold a training step of data.batch_size = {batch_size} "
            f"at {'×'.join(map(str, input_shape))}: the process already takes {_gb(resident)}, the decoded "
            f"batches {_gb(step * (1 + workers))}, {_gb(keep)} is kept free, and one client's step needs {_gb(need)} "
            f"({_gb(train_sample)} per sample, measured); raise data.memory_budget or lower "
            "data.batch_size or data.image_size"
        )
    per_step = min(clients, free // need) if batched else 1
    extra = free - per_step * need  # what training leaves: more prefetch, then evaluation
    prefetch = int(min(max_prefetch, 1 + extra // 2 // max(1, step * workers))) if workers else 0
    extra -= (prefetch - 1) * step * workers if workers else 0
    if eval_setting is not None:
        eval_batch = eval_setting
    else:  # beside the training step's share: glibc keeps that heap for the next round
        eval_batch = int(min(MAX_EVAL_BATCH, max(1, extra // eval_sample)))
    return MemoryPlan(budget, resident, train_sample, eval_sample, step, int(per_step), prefetch, eval_batch)


BATCHED_ENGINES = ("vmap", "compile", "auto")  # engines that step several clients at once


def chunking(engine: str, plan: MemoryPlan | None, clients: int) -> dict[str, int] | None:
    """The engine options of ``plan``: a batched engine steps ``clients_per_step`` clients at a
    time when all ``clients`` would not fit (``vmap``'s ``chunk_size``), else as it would."""
    if plan is None or engine not in BATCHED_ENGINES or plan.clients_per_step >= clients:
        return None
    return {"chunk_size": plan.clients_per_step}
