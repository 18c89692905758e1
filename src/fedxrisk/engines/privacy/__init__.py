"""Differential privacy at the engine level (issue 23): client-level DP around the round's
collective (:class:`PrivateCollective`), client sampling per round (:class:`ClientSampling`),
the accountant (:func:`epsilon`, :func:`noise_for_epsilon`) and instance-level DP-SGD in the
local step (:func:`instance_private`). See docs/privacy.md."""

from fedxrisk.engines.privacy.accountant import epsilon, fixed_count, noise_for_epsilon
from fedxrisk.engines.privacy.collective import (
    ClientDP,
    PrivateAggregator,
    PrivateCollective,
    check_client_dp,
    unsupported_reason,
)
from fedxrisk.engines.privacy.instance import (
    DPSGD,
    check_instance_dp,
    instance_private,
    poisson_batches,
    private_batch,
    step_noise,
    unsupported_instance_reason,
)
from fedxrisk.engines.privacy.noise import NoiseSource
from fedxrisk.engines.privacy.sampling import (
    ClientSampling,
    after_communicate,
    before_communicate,
    keep_idle,
)

__all__ = [
    "DPSGD", "ClientDP", "ClientSampling", "PrivateAggregator", "PrivateCollective", "after_communicate",
    "before_communicate", "check_client_dp", "check_instance_dp", "epsilon", "fixed_count",
    "instance_private", "keep_idle", "NoiseSource", "noise_for_epsilon", "poisson_batches", "private_batch", "step_noise",
    "unsupported_instance_reason", "unsupported_reason",
]  # fmt: skip
