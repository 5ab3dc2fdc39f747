"""The engine's counters, and their rendering in Prometheus' text exposition format (0.0.4).

Counters are plain ints written by the engine thread and read by the HTTP side; under the GIL a
reader sees each value whole, and a scrape needs no more than that.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..engine.kv_cache import KVPool
    from ..engine.scheduler import Scheduler


class Engine(Protocol):
    """What the metrics read of the server's engine (engine.py, which imports this module: its shape, not its class)."""
    metrics: EngineMetrics
    scheduler: Scheduler
    pool: KVPool
    model: Any

    @property
    def running(self) -> int: ...

    @property
    def waiting(self) -> int: ...

Sample = tuple[str, Mapping[str, object], float | str]  # (name suffix, labels, value: a number, or its text)
Family = tuple[str, str, str, list[Sample]]  # (name, kind, help, samples)


@dataclasses.dataclass
class EngineMetrics:
    requests_received: int = 0
    generation_tokens: int = 0
    first_token_seconds_sum: float = 0.0  # arrival -> first token chosen, over every request that got one
    first_token_count: int = 0
    finished: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # by reason
    http_errors: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # by status
    client_disconnects: int = 0  # requests whose client hung up before its request was read (HTTP side)
    # by LoRA adapter name ("": the base model): requests received, tokens generated
    adapter_requests: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    adapter_tokens: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def observe_first_token(self, seconds: float) -> None:
        self.first_token_seconds_sum += seconds
        self.first_token_count += 1

    def count_finished(self, reason: str) -> None:
        self.finished[reason] += 1


def _label_value(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _family(name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for suffix, labels, value in samples:
        label_text = "{" + ",".join(f'{k}="{_label_value(v)}"' for k, v in labels.items()) + "}" if labels else ""
        lines.append(f"{name}{suffix}{label_text} {value}")
    return lines


def kv_blocks(pool: KVPool) -> list[tuple[str, int]]:
    stats = pool.stats()
    return [(state, stats[state]) for state in ("used", "cached", "free")]


def render(engine: Engine, model_name: str) -> str:
    """All metrics of ``engine`` as Prometheus text."""
    lines = [line for family in families(engine, model_name) for line in _family(*family)]
    return "\n".join(lines) + "\n"


def families(engine: Engine, model_name: str) -> list[Family]:
    """Every metric of ``engine``: (name, kind, help, samples), each sample (name suffix, labels, value)."""
    m = engine.metrics
    model = {"model": model_name}
    reasons = sorted(set(m.finished) | {"stop", "length", "cancelled", "error"})
    engine_families: list[Family] = [
        ("llaisys_requests_received_total", "counter", "Requests accepted into the engine's queue.",
         [("", model, m.requests_received)]),
        ("llaisys_requests_finished_total", "counter", "Requests the engine finished, by finish reason.",
         [("", {**model, "reason": r}, m.finished[r]) for r in reasons]),
        ("llaisys_requests_running", "gauge", "Sequences being generated now.", [("", model, engine.running)]),
        ("llaisys_requests_waiting", "gauge", "Requests queued for a free slot.", [("", model, engine.waiting)]),
        ("llaisys_prompt_tokens_computed_total", "counter", "Prompt tokens run through the model (prefill).",
         [("", model, engine.scheduler.stats.prompt_tokens_computed)]),
        ("llaisys_prompt_tokens_reused_total", "counter",
         "Prompt tokens whose keys/values were reused from the KV cache instead of being computed.",
         [("", model, engine.scheduler.stats.prompt_tokens_reused)]),
        ("llaisys_prompt_tokens_forked_total", "counter",
         "Prompt tokens of a request's further choices (n > 1), whose keys/values the first choice computed.",
         [("", model, engine.scheduler.stats.prompt_tokens_forked)]),
        ("llaisys_generation_tokens_total", "counter", "Tokens generated.", [("", model, m.generation_tokens)]),
        ("llaisys_time_to_first_token_seconds", "summary", "From a request's arrival to its first token.",
         [("_sum", model, f"{m.first_token_seconds_sum:.6f}"), ("_count", model, m.first_token_count)]),
        ("llaisys_kv_cache_bytes", "gauge", "Device memory of the paged KV cache.",
         [("", model, engine.pool.nbytes)]),
        ("llaisys_kv_cache_capacity_tokens", "gauge",
         "Positions the paged KV cache holds, in its storage (cache_dtype: auto = the model's dtype, int8, fp8).",
         [("", {**model, "cache_dtype": engine.pool.shape.cache_dtype}, engine.pool.capacity_tokens)]),
        ("llaisys_kv_cache_blocks", "gauge",
         "KV cache blocks by state: used by sequences, cached (a finished prefix, reusable), free.",
         [("", {**model, "state": state}, n) for state, n in kv_blocks(engine.pool)]),
        ("llaisys_preemptions_total", "counter",
         "Sequences preempted (freed, then recomputed): the KV cache ran out, or another request needed a slot.",
         [("", model, engine.scheduler.stats.preemptions)]),
        ("llaisys_fair_preemptions_total", "counter",
         "Preemptions that made room for a request running nothing (taken from the request running the most).",
         [("", model, engine.scheduler.stats.fair_preemptions)]),
        ("llaisys_recomputed_tokens_total", "counter", "Tokens computed again after a preemption.",
         [("", model, engine.scheduler.stats.recomputed_tokens)]),
        ("llaisys_spec_draft_tokens_total", "counter", "Speculative decoding: drafted tokens verified.",
         [("", model, engine.scheduler.stats.draft_tokens)]),
        ("llaisys_spec_accepted_tokens_total", "counter",
         "Speculative decoding: drafted tokens the model kept (acceptance = accepted / draft).",
         [("", model, engine.scheduler.stats.accepted_tokens)]),
        ("llaisys_engine_steps_total", "counter", "Forward passes (each batches every running sequence).",
         [("", model, engine.scheduler.stats.steps)]),
        ("llaisys_http_errors_total", "counter", "Requests rejected with an HTTP error, by status code.",
         [("", {**model, "status": s}, n) for s, n in sorted(m.http_errors.items())]),
        ("llaisys_http_client_disconnects_total", "counter",
         "Requests whose client hung up before the request was read (not answered, not an error).",
         [("", model, m.client_disconnects)]),
    ]
    return engine_families + lora_families(engine, model)


def lora_families(engine: Engine, model: dict[str, str]) -> list[Family]:
    """Where the model serves LoRA adapters (``llaisys serve --lora``, ``--allow-runtime-lora``): requests and
    generated tokens by adapter (label ``adapter``: its name, "" for the base model), and the adapters loaded."""
    lora_model = getattr(engine, "model", None)
    if getattr(lora_model, "lora", None) is None:
        return []
    m = engine.metrics
    names = sorted(set(m.adapter_requests) | set(m.adapter_tokens) | {""})
    return [
        ("llaisys_lora_requests_total", "counter",
         "Requests accepted into the engine's queue, by LoRA adapter (adapter=\"\": the base model).",
         [("", {**model, "adapter": name}, m.adapter_requests[name]) for name in names]),
        ("llaisys_lora_generation_tokens_total", "counter",
         "Tokens generated, by LoRA adapter (adapter=\"\": the base model).",
         [("", {**model, "adapter": name}, m.adapter_tokens[name]) for name in names]),
        ("llaisys_lora_adapters_loaded", "gauge", "LoRA adapters loaded (requests may name them as their model).",
         [("", model, len(getattr(lora_model, "loras", {})))]),
    ]
