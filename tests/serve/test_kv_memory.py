"""The server's default KV cache size: a quarter of the free memory (llaisys.mem_info on an accelerator, the
OS's MemAvailable on the CPU), capped at max_running full contexts, at least 4 blocks; 1 GiB where the device
cannot say how much is free."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import llaisys
from llaisys import plugins
from llaisys_models.serve import kv_memory

GIB = 1 << 30


class _MemoryBackend(llaisys.Backend):
    """One pure-Python "accelerator" whose memory info is ``info`` (None: no memory-info capability)."""

    name = "fakegpu"

    def __init__(self, info: tuple[int, int] | None):
        self.info = info

    def device_count(self) -> int:
        return 1

    def supports(self, capability: str) -> bool:
        return super().supports(capability) or (capability == "mem_info" and self.info is not None)

    def mem_info(self, device_index: int) -> tuple[int, int] | None:
        return self.info


@pytest.fixture
def fake_gpu():
    """use(info) makes the process registry one fake accelerator, "fakegpu:0", with that memory info."""
    saved = plugins._registry

    def use(info: tuple[int, int] | None) -> llaisys.Device:
        class Plugin:
            @llaisys.hookimpl
            def llaisys_backends(self):
                return [llaisys.BackendSpec("fakegpu", lambda: _MemoryBackend(info))]

        entry_point = SimpleNamespace(name="fakegpu", value="fake_gpu_plugin", load=lambda: Plugin())
        plugins._registry = plugins.Registry(entry_points=[entry_point], env_filter="")
        return llaisys.Device("fakegpu", 0)
    yield use
    plugins._registry = saved


def _model(device, bytes_per_token: int = 28672, max_positions: int = 32768, ranks: int = 1):
    """What default_kv_memory reads of a model (the defaults: Qwen2-1.5B's KV bytes per token and context; one
    rank, not split by tensor parallelism)."""
    return SimpleNamespace(device=device, kv_shape=SimpleNamespace(bytes_per_token=bytes_per_token),
                           config=SimpleNamespace(max_position_embeddings=max_positions),
                           group=SimpleNamespace(world_size=ranks))


def test_a_quarter_of_the_free_gpu_memory(fake_gpu):
    device = fake_gpu((6 * GIB, 80 * GIB))
    assert llaisys.mem_info(device) == (6 * GIB, 80 * GIB)
    # one full context (3.5 GiB) or 32 sequences of 2048 tokens (1.75 GiB): more than a quarter of 6 GiB
    assert kv_memory.default_kv_memory(_model(device, max_positions=131072), max_running=32) == 6 * GIB // 4


def test_plans_max_running_sequences_of_a_chat_turn(fake_gpu):
    """A 135M model (SmolLM2: 46080 bytes a token in f32, a context of 8192) got 16 full contexts, 5.6 GiB; now
    16 sequences of 2048 tokens, 1.41 GiB, however much memory is free."""
    model = _model(fake_gpu((60 * GIB, 80 * GIB)), bytes_per_token=46080, max_positions=8192)
    assert kv_memory.default_kv_memory(model, max_running=16) == 16 * 2048 * 46080
    assert kv_memory.default_kv_memory(model, max_running=2) == 8192 * 46080  # at least one full context


def test_at_most_max_running_full_contexts(fake_gpu):
    model = _model(fake_gpu((60 * GIB, 80 * GIB)), max_positions=1024)
    assert kv_memory.default_kv_memory(model, max_running=4) == 4 * 1024 * 28672


def test_at_least_one_full_context(fake_gpu):
    model = _model(fake_gpu((60 * GIB, 80 * GIB)))
    assert kv_memory.default_kv_memory(model, max_running=4) == 32768 * 28672  # 3.5 GiB < 15 GiB


def test_at_least_four_blocks(fake_gpu):
    model = _model(fake_gpu((1000, 80 * GIB)))
    assert kv_memory.default_kv_memory(model, max_running=16, block_size=16) == 4 * 16 * 28672


def test_1_gib_where_the_device_cannot_say(fake_gpu):
    device = fake_gpu(None)
    assert llaisys.mem_info(device) is None
    model = _model(device, max_positions=131072)  # (one context: 3.5 GiB)
    assert kv_memory.default_kv_memory(model, max_running=16) == kv_memory.FALLBACK_BYTES == GIB


def test_the_cpu_counts_what_the_os_says_is_available(tmp_path, monkeypatch):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16777216 kB\nMemFree:          524288 kB\nMemAvailable:    8388608 kB\n")
    monkeypatch.setattr(kv_memory, "MEMINFO", meminfo)
    cpu = llaisys.Device("cpu", 0)
    assert kv_memory.free_memory(cpu) == 8 * GIB
    assert kv_memory.default_kv_memory(_model(cpu, max_positions=131072), max_running=16) == 2 * GIB


def test_the_cpu_without_proc_meminfo_asks_its_backend(tmp_path, monkeypatch):
    monkeypatch.setattr(kv_memory, "MEMINFO", tmp_path / "missing")
    cpu = llaisys.Device("cpu", 0)
    free, info = kv_memory.free_memory(cpu), llaisys.mem_info(cpu)
    if info is None:
        assert free is None
    else:
        assert 0 < free <= info[1]


@pytest.mark.parametrize("nbytes, shown", [(4 << 20, "4.00 MiB"), (3 * GIB // 2, "1.50 GiB"), (512, "512 B"),
                                           (1536, "1.50 KiB"), (2 << 40, "2.00 TiB")])
def test_describe_shows_the_size_in_a_unit_that_fits(nbytes, shown):
    """A 4 MiB cache was 'KV cache 0.00 GiB'."""
    pool = SimpleNamespace(nbytes=nbytes, num_blocks=4, block_size=16, capacity_tokens=64,
                           shape=SimpleNamespace(bytes_per_token=nbytes // 64, kv_format=None))
    assert kv_memory.describe(pool).startswith(f"KV cache {shown}: 4 blocks of 16 positions (64 tokens, ")


def test_describe_names_a_quantized_cache():
    from llaisys_models.engine.kv_cache import KVPool, KVShape

    shape = KVShape(2, 2, 64, llaisys.bfloat16, llaisys.Device("cpu", 0), "int8")
    pool = KVPool(shape, 4, 16)
    assert shape.bytes_per_token == 2 * 2 * 2 * (64 + 2)
    assert kv_memory.describe(pool) == (f"KV cache {kv_memory.human_size(pool.nbytes)}: 4 blocks of 16 positions "
                                        f"(64 tokens, 528 bytes each, keys and values in int8)")


def test_cpu_ranks_of_a_split_model_share_the_quarter(monkeypatch):
    monkeypatch.setattr(kv_memory, "free_memory", lambda device: 64 * GIB)
    cpu = llaisys.Device("cpu", 0)
    for ranks in (1, 2):
        model = _model(cpu, ranks=ranks, max_positions=1 << 20)  # (a context of 28 GiB)
        assert kv_memory.default_kv_memory(model, max_running=32) == 16 * GIB // ranks
