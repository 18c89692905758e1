"""The one noise source of every DP mechanism (issue 30): secret by default, reproducible on request.

:meth:`NoiseSource.secret` (the default) draws 256 bits of fresh entropy from the operating
system (:mod:`secrets`) once per run; they are never derived from the run seed, never written
to any file, and share nothing with the data streams. :meth:`NoiseSource.reproducible` fixes
them from an integer: a test mode whose runs are marked "not private" (anyone holding the
seed regenerates the noise and subtracts it).

The bits come from SHAKE-256 (an extendable-output hash, i.e. a cryptographically secure
generator) over (entropy, key, counter). A Gaussian is drawn as Opacus's secure mode does
(Holohan & Braghin 2021, against Mironov's floating-point attack, CCS 2012): 4 independent
float64 normals, each by Box–Muller from two 53-bit uniforms, summed and halved — the sum of
2n normals divided by √(2n) is again N(0, 1), and its low-order bits no longer reveal which
value was drawn. The draw is in float64 on the CPU, then scaled and cast.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

SUMMED = 4  # normals per Gaussian draw (Opacus's secure mode: 2n with n = 2)
_DOMAIN = b"fedxrisk-noise-v1"


def _words(entropy: bytes, key: tuple[int, ...], counter: int, count: int) -> np.ndarray:
    """``count`` uint64 words of SHAKE-256(domain, entropy, key, counter)."""
    header = struct.pack("<Q", len(entropy)) + entropy + struct.pack(f"<Q{len(key)}q", len(key), *key)
    digest = hashlib.shake_256(_DOMAIN + header + struct.pack("<Q", counter)).digest(8 * count)
    return np.frombuffer(digest, dtype="<u8").astype(np.uint64)


class NoiseSource:
    """A stream of secure random numbers; :meth:`spawn` derives independent sub-streams (a round,
    a client) so every engine — and every rank — draws the same numbers from the same source."""

    __slots__ = ("_entropy", "_key", "_counter", "_private")

    def __init__(self, entropy: bytes, private: bool, key: tuple[int, ...] = ()):
        self._entropy, self._private, self._key, self._counter = bytes(entropy), private, tuple(key), 0

    @classmethod
    def secret(cls) -> NoiseSource:
        """Fresh entropy from the operating system: nothing written anywhere regenerates it."""
        return cls(secrets.token_bytes(32), private=True)

    @classmethod
    def reproducible(cls, seed: int) -> NoiseSource:
        """Noise fixed by ``seed``: for tests only — the run is not private."""
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"reproducible noise needs an integer seed ≥ 0, got {seed!r}")
        return cls(b"reproducible" + seed.to_bytes(16, "little"), private=False)

    @property
    def private(self) -> bool:
        """False in the reproducible test mode."""
        return self._private

    def spawn(self, *key: int) -> NoiseSource:
        """An independent stream named by ``key`` (e.g. (round, stream tag)), starting afresh."""
        return NoiseSource(self._entropy, self._private, self._key + tuple(int(k) for k in key))

    def _next(self, count: int) -> np.ndarray:
        words = _words(self._entropy, self._key, self._counter, count)
        self._counter += 1
        return words

    def uniform(self, count: int) -> np.ndarray:
        """``count`` float64 uniforms on (0, 1]: 53 random bits k each, exactly (k + 1)·2⁻⁵³."""
        if count == 0:
            return np.zeros(0)
        return ((self._next(count) >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0**-53

    def standard_normal(self, count: int) -> np.ndarray:
        """``count`` float64 N(0, 1) draws, each the sum of :data:`SUMMED` Box–Muller normals / √SUMMED."""
        if count == 0:
            return np.zeros(0)
        u = self.uniform(2 * SUMMED * count).reshape(2, SUMMED, count)
        normals = np.sqrt(-2.0 * np.log(u[0])) * np.cos(2.0 * math.pi * u[1])
        return normals.sum(0) / math.sqrt(SUMMED)

    def gaussian(
        self, shape: tuple[int, ...] | torch.Size, std: float, *, dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> torch.Tensor:  # fmt: skip
        """N(0, std²) of ``shape``, drawn in float64 (see the module docstring), then cast."""
        if not std >= 0 or math.isinf(std):
            raise ValueError(f"noise std must be a finite number ≥ 0, got {std}")
        shape = tuple(int(s) for s in shape)
        draws = self.standard_normal(math.prod(shape)).reshape(shape)
        return (torch.from_numpy(draws) * float(std)).to(device=device, dtype=dtype)

    def shared(self, broadcast: Callable[[bytes], bytes]) -> NoiseSource:
        """The same source on every process: ``broadcast`` sends rank 0's entropy to all ranks
        (in memory, over the process group; torch.distributed engine)."""
        return NoiseSource(broadcast(self._entropy), self._private, self._key)

    def __repr__(self) -> str:  # never the entropy
        return f"NoiseSource({'secret' if self._private else 'reproducible (not private)'}, key={self._key})"

    def __reduce__(self) -> Any:  # torch.save / pickle / deepcopy of a source is refused
        raise TypeError(
            "a NoiseSource is never saved: a DP run's noise must not be recoverable from its files"
        )
