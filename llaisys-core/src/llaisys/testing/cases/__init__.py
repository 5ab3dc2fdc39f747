"""Every conformance case, by op family (one module each); ``all_cases()`` is the suite in a fixed order."""

from __future__ import annotations

import functools

from ...abi import OP_SLOTS
from ..case import Case
from . import attention, attention_q, elementwise, gq, latent, lora, moe, nn, quant, sampling

MODULES = (elementwise, nn, attention, attention_q, latent, moe, quant, gq, lora, sampling)


@functools.cache
def all_cases() -> tuple[Case, ...]:
    """The whole suite, op by op in backend.h's order (built once: a case is a description, its inputs are made
    when it runs)."""
    order = list(OP_SLOTS)
    return tuple(sorted((case for module in MODULES for case in module.cases()), key=lambda c: order.index(c.op)))


def perf_setups() -> dict:
    """{op: (shape, setup(ctx) -> zero-argument call)} for ``--perf``: one representative shape per op."""
    setups: dict = {}
    for module in MODULES:
        setups.update(module.PERF)
    return setups
