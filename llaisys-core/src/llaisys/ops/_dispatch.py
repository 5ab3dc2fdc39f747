"""From a validated op call to its kernel.

An op frontend validates its tensor arguments once per combination of their layouts
(``Tensor.layout``: device, dtype, shape, contiguity, writability; interned, so a lookup only
hashes identities) and remembers the result as a *plan*: the kernel, its failure handler, the
device and the C arguments that follow from the layouts (dtype code, sizes). A later call
with the same layouts looks the plan up, checks what differs per call (pointer overlap,
scalars) and calls the kernel. Kernels come from the registry, resolved once per (op,
device type): the one kernel cache. An op the device's backend lacks resolves to the CPU
fallback (``llaisys.fallback``), so the frontends never tell the two apart.
"""

from __future__ import annotations

from ..device import as_device
from ..errors import BackendUnavailableError, NotSupportedError
from ..plugins import registry
from ..stream import current_stream_handle

__all__ = ["clear_plans", "current_stream_handle", "kernel_for", "new_plans", "remember"]

MAX_PLANS = 4096  # per op; then start over (a plan is only a memo of checks that passed)
_all_plans: list[dict] = []


def new_plans() -> dict:
    """A plan cache for one op: {tuple of argument layouts: plan tuple}."""
    plans: dict = {}
    _all_plans.append(plans)
    return plans


def remember(plans: dict, key: tuple, plan: tuple) -> tuple:
    if len(plans) >= MAX_PLANS:
        plans.clear()
    plans[key] = plan
    return plan


def kernel_for(op: str, device, runs: bool = True):
    """(kernel, fail) for ``op`` on ``device``; a call that has nothing to compute (``runs`` False) gets a no-op."""
    if not runs:
        return _nothing, None
    return registry().launcher(op, device.type)


def _nothing(*args) -> int:
    return 0


def clear_plans() -> None:
    """Forget every plan and resolved kernel (after kernels were replaced, e.g. in a benchmark's stubs, or
    LLAISYS_FALLBACK changed)."""
    registry().clear_kernels()
    for plans in _all_plans:
        plans.clear()


def implemented(op: str, device) -> bool:
    """Whether ``op`` runs on ``device``: its backend's kernel, a plugin's override, or the CPU backend's
    kernel where the backend lacks it (``llaisys.fallback``; not with LLAISYS_FALLBACK=0). A caller can
    refuse, or choose another device, before a model runs instead of failing at its first call;
    ``llaisys.capabilities(device)`` tells which of the three it is."""
    try:
        registry().launcher(op, as_device(device).type)
    except (NotSupportedError, BackendUnavailableError):  # (a bad LLAISYS_FALLBACK value still raises)
        return False
    return True
