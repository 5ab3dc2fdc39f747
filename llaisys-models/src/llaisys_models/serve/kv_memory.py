"""How much memory the server's KV cache gets: ``--kv-memory`` sizes ("4GiB", "512MB", bytes), and a default.

The default plans for what a server runs: the model's full context once (so that one request can use all of
it), or ``max_running`` sequences of ``TOKENS_PER_SEQUENCE`` tokens each if that is more. It never takes more
than a quarter of the device's free memory (what ``llaisys.mem_info`` reports; on a CPU the memory the OS says
is available), and at least a few blocks. When running sequences outgrow it, the newest waits (its blocks
freed, its tokens computed again later): nothing is refused for it. The server prints what it got at start-up.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import llaisys

if TYPE_CHECKING:
    from ..engine.kv_cache import KVPool
    from ..families.causal_lm import CausalLM

DEFAULT_FRACTION = 0.25
# a prompt and a reply of a chat, typically, and the server's default reply cap: a 135M model's KV cache in f32
# (46 KiB a token) is 1.4 GiB for 16 such sequences, where 16 full contexts of 8192 took 5.6 GiB
TOKENS_PER_SEQUENCE = 2048
FALLBACK_BYTES = 1 << 30  # when the device cannot say how much memory is free
MEMINFO = Path("/proc/meminfo")  # where the CPU's available memory is read
_UNITS = {"": 1, "b": 1, "k": 10 ** 3, "kb": 10 ** 3, "m": 10 ** 6, "mb": 10 ** 6, "g": 10 ** 9, "gb": 10 ** 9,
          "t": 10 ** 12, "tb": 10 ** 12, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from '4GiB', '1.5 GB', '512m', '1048576' (k/M/G are powers of 10, KiB/MiB/GiB of 2)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise llaisys.LlaisysValueError(f"not a memory size: {text!r} (e.g. 4GiB, 512MB, 1073741824)")
    size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise llaisys.LlaisysValueError(f"the memory size must be positive, got {text!r}")
    return size


def free_memory(device: llaisys.Device) -> int | None:
    """Free bytes on ``device``, or None when nobody can tell.

    On the CPU, the OS's MemAvailable where it says (unlike the free pages the CPU backend's ``mem_info``
    counts, it includes the page cache that memory-mapped weights occupy and that the OS can reclaim);
    everywhere else, the free bytes of ``llaisys.mem_info``."""
    if device.type == "cpu":
        available = _host_available_bytes()
        if available is not None:
            return available
    info = llaisys.mem_info(device)
    return None if info is None else info[0]


def _host_available_bytes() -> int | None:
    try:
        with MEMINFO.open(encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def default_kv_memory(model: CausalLM, max_running: int, block_size: int = 16) -> int:
    """The model's full context, or ``max_running`` sequences of ``TOKENS_PER_SEQUENCE`` tokens if more; at most a
    quarter of the free memory, at least 4 blocks. (The ranks of a tensor-parallel model on the CPU share the
    host's memory: each gets its share of the quarter.)"""
    free = free_memory(model.device)
    budget = int(free * DEFAULT_FRACTION) if free is not None else FALLBACK_BYTES
    if model.device.type == "cpu":
        budget //= model.group.world_size
    per_token = model.kv_shape.bytes_per_token
    context = model.config.max_position_embeddings
    planned = max(context, max_running * min(TOKENS_PER_SEQUENCE, context)) * per_token
    return max(min(budget, planned), 4 * block_size * per_token)


def human_size(nbytes: int) -> str:
    """'4.00 MiB', '1.50 GiB', '512 B': the largest binary unit that keeps the number at 1 or more."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{nbytes} B"


def describe(pool: KVPool) -> str:
    """One line for the start-up message: size, blocks, tokens."""
    stored = "" if pool.shape.kv_format is None else f", keys and values in {pool.shape.kv_format}"
    return (f"KV cache {human_size(pool.nbytes)}: {pool.num_blocks} blocks of {pool.block_size} positions "
            f"({pool.capacity_tokens} tokens, {pool.shape.bytes_per_token} bytes each{stored})")
