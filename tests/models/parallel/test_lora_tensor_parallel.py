"""LoRA adapters on a tensor-parallel model (2 CPU ranks: this process and one it starts).

Each rank holds its part of every pair, cut along its base weight's axis (lora/shard.py): B's rows of a
column-parallel linear, A's columns of a row-parallel one, a replicated kv head's pair whole. In f32 the greedy
tokens under each adapter, and of one batch mixing the base model and two adapters, are the one-rank model's with
the same adapters. Rank 0 tells the other rank what to load, unload and merge, and which adapter each slot holds
(more adapters than slots take turns); a rank that cannot read an adapter fails the load naming it, and the group
goes on.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import llaisys_models
from helpers.lora_adapters import TinyAdapters
from helpers.tiny_models import SPECS, prompt
from llaisys_models.errors import ModelLoadError
from llaisys_models.lora.shard import shard_adapter, whole_config
from llaisys_models.parallel.layout import Layout

BASES = ("f32_gqa2_hd32", "llama_f32_tied")  # Qwen2 (2 kv heads split, q/k/v biases), Llama (1 kv head replicated)
ADAPTERS = {"a": "all_r8", "b": "patterns"}  # every linear; q/k/o/down with rank and alpha patterns
LENGTHS = (1, 13, 64)
NEW = 20


@pytest.fixture(scope="module")
def adapters(tiny_models, tmp_path_factory) -> TinyAdapters:
    return TinyAdapters(tiny_models, tmp_path_factory.mktemp("lora_tp"))


def with_adapters(model, adapters, base, names=ADAPTERS):
    for name in names:
        model.load_lora(name, adapters.path(base, ADAPTERS.get(name, name)))
    return model


@pytest.fixture(scope="module")
def models(tiny_models, adapters):
    """base -> (the model split over 2 ranks, the model on one), each with adapters a and b."""
    for base in BASES:  # (made here, once: the loads below run at once)
        for adapter in ADAPTERS.values():
            adapters.path(base, adapter)
    with ThreadPoolExecutor(len(BASES)) as pool:
        loads = {base: pool.submit(llaisys_models.load, tiny_models.path(base), device="cpu", tensor_parallel=2)
                 for base in BASES}
    split = {base: load.result() for base, load in loads.items()}
    pairs = {base: (with_adapters(split[base], adapters, base),
                    with_adapters(llaisys_models.load(tiny_models.path(base), device="cpu"), adapters, base))
             for base in BASES}
    yield pairs
    for model in split.values():
        model.close()


@pytest.mark.parametrize("base", BASES)
def test_greedy_tokens_are_one_rank_s(models, base):
    model, whole = models[base]
    vocab = SPECS[base].vocab
    replays = model._decode_graphs.replays
    for lora in (None, "a", "b"):
        for length in LENGTHS:
            ids = prompt(base, length, vocab)
            got = model.generate(ids, NEW, lora=lora, eos_token_ids=())
            assert got == whole.generate(ids, NEW, lora=lora, eos_token_ids=()), (lora, length)
    assert model._decode_graphs.replays > replays, "the split model's decode steps ran from graphs"
    assert (model.generate(prompt(base, 13, vocab), NEW, lora="a", eos_token_ids=())
            != model.generate(prompt(base, 13, vocab), NEW, eos_token_ids=())), "the adapter changes the output"
    prompts = [prompt(base, n, vocab) for n in (13, 1, 64, 5, 30)]
    names = [None, "a", "b", "a", None]
    assert (model.generate_batch(prompts, NEW, lora=names, eos_token_ids=())
            == whole.generate_batch(prompts, NEW, lora=names, eos_token_ids=()))
    long = prompt(base, 300, vocab)  # a step whose message (with each row's slot) takes two broadcasts
    np.testing.assert_allclose(model.logits(long, lora="b"), whole.logits(long, lora="b"), rtol=0, atol=1e-4)


def test_each_rank_holds_its_part(models):
    """Rank 0's slots are its part's shapes, its pairs the whole pairs' parts; rank 1's part (cut here as rank 1
    cuts it) is the rest: the two put together are the whole adapter."""
    base = "llama_f32_tied"  # 4 q heads, 1 kv head (replicated on both ranks)
    model, whole = models[base]
    spec = SPECS[base]
    d, slots, rank = spec.hidden // spec.heads, model.lora.max_loras, model.lora.max_rank
    shapes = {field: (linear.a.shape, linear.b.shape) for (layer, field), linear in model.lora.linears.items()
              if layer == 0}
    h, i = spec.hidden, spec.inter
    assert shapes == {"q_proj": ((slots, rank, h), (slots, rank, 2 * d)),  # B: N/2 rows
                      "k_proj": ((slots, rank, h), (slots, rank, d)),  # the one kv head, whole
                      "v_proj": ((slots, rank, h), (slots, rank, d)),
                      "o_proj": ((slots, rank, 2 * d), (slots, rank, h)),  # A: K/2 columns
                      "gate_proj": ((slots, rank, h), (slots, rank, i // 2)),
                      "up_proj": ((slots, rank, h), (slots, rank, i // 2)),
                      "down_proj": ((slots, rank, i // 2), (slots, rank, h))}
    config = whole_config(model)
    for name in ADAPTERS:
        full, mine = whole.loras[name], model.loras[name]
        assert mine.uid == model.loras[name].uid and set(mine.pairs) == set(full.pairs)
        other = shard_adapter(full, Layout(1, 2), config)
        for key, pair in full.pairs.items():
            parts = (mine.pairs[key], other.pairs[key])
            assert [p.scale for p in parts] == [pair.scale] * 2
            field = key[1]
            if field in ("k_proj", "v_proj"):  # replicated
                for p in parts:
                    np.testing.assert_array_equal(p.a, pair.a)
                    np.testing.assert_array_equal(p.b, pair.b)
            elif field in ("o_proj", "down_proj"):  # row-parallel: A's columns
                np.testing.assert_array_equal(np.concatenate([p.a for p in parts], axis=1), pair.a)
                assert parts[0].a.shape[1] == pair.a.shape[1] // 2
                for p in parts:
                    np.testing.assert_array_equal(p.b, pair.b)
            else:  # column-parallel: B's rows
                np.testing.assert_array_equal(np.concatenate([p.b for p in parts]), pair.b)
                assert parts[0].b.shape[0] == pair.b.shape[0] // 2
                for p in parts:
                    np.testing.assert_array_equal(p.a, pair.a)


def test_split_kv_heads_cut_k_and_v(models):
    base = "f32_gqa2_hd32"  # 2 kv heads: one on each rank
    model, whole = models[base]
    d = SPECS[base].hidden // SPECS[base].heads
    pair, mine = whole.loras["a"].pairs[1, "k_proj"], model.loras["a"].pairs[1, "k_proj"]
    np.testing.assert_array_equal(mine.b, pair.b[:d])
    np.testing.assert_array_equal(shard_adapter(whole.loras["a"], Layout(1, 2), whole_config(model))
                                  .pairs[1, "k_proj"].b, pair.b[d:])


def test_unload_load_turns_and_merge(tiny_models, adapters):
    """One slot (adapters take turns: rank 1 follows rank 0's choice of slot), unload then load another, and a
    merge, each rank folding its part into its part: the one-rank model's tokens throughout."""
    base = "f32_gqa2_hd32"
    vocab = SPECS[base].vocab
    model = llaisys_models.load(tiny_models.path(base), device="cpu", tensor_parallel=2)
    try:
        whole = llaisys_models.load(tiny_models.path(base), device="cpu")
        for m in (model, whole):
            m.enable_lora(max_loras=1, max_lora_rank=16)
            with_adapters(m, adapters, base)
        ids = [prompt(base, n, vocab) for n in (13, 7, 30)]

        def same(names):
            want = whole.generate_batch(ids, NEW, lora=names, eos_token_ids=())
            assert model.generate_batch(ids, NEW, lora=names, eos_token_ids=()) == want, names

        same(["a", "b", None])
        same(["b", "a", "b"])
        for m in (model, whole):
            m.unload_lora("a")
            with_adapters(m, adapters, base, names=("qv_r16_rslora",))
        with pytest.raises(Exception, match="no LoRA adapter named 'a'"):
            model.generate(ids[0], 2, lora="a")
        same(["qv_r16_rslora", "b", None])
        for m in (model, whole):
            m.merge_lora("b")
        same([None, "qv_r16_rslora", None])
        assert sorted(model.loras) == ["qv_r16_rslora"]
    finally:
        model.close()


def test_a_rank_that_cannot_read_fails_the_load(models, adapters, monkeypatch):
    """Rank 0 reads the adapter, then rank 1 cannot (here: the file is gone by then): the load fails naming rank 1
    and its error, no rank keeps the adapter, and the group goes on (the same adapter loads once it is back)."""
    base = "f32_gqa2_hd32"
    model, whole = models[base]
    path = adapters.path(base, "qv_r16_rslora")
    weights, away = path / "adapter_model.safetensors", path / "away.safetensors"
    read = model._read_lora

    def read_then_remove(*args):
        adapter = read(*args)
        shutil.move(weights, away)
        return adapter

    monkeypatch.setattr(model, "_read_lora", read_then_remove)
    try:
        with pytest.raises(ModelLoadError, match=r"rank 1 of the tensor-parallel group could not read .*: "
                                                 r"ModelLoadError: .*adapter_model.safetensors") as failed:
            model.load_lora("c", path)
    finally:
        if away.exists():
            shutil.move(away, weights)
    assert "\n" not in str(failed.value) and "c" not in model.loras
    monkeypatch.undo()
    ids = prompt(base, 13, SPECS[base].vocab)
    assert model.generate(ids, NEW, lora="a", eos_token_ids=()) == whole.generate(ids, NEW, lora="a", eos_token_ids=())
    model.load_lora("c", path)
    try:
        whole.load_lora("c", path)
        assert (model.generate(ids, NEW, lora="c", eos_token_ids=())
                == whole.generate(ids, NEW, lora="c", eos_token_ids=()))
    finally:
        for m in (model, whole):
            m.unload_lora("c")


@pytest.mark.parametrize("base", ["llama_f32_tied", "phi3_f32"])
def test_gguf_and_fused_adapters(tiny_models, tmp_path, base):
    """A llama.cpp GGUF adapter (Llama's permuted Q/K rows, read against the whole model's heads) and Phi-3's fused
    qkv_proj / gate_up_proj (B split into the linears' rows, then cut): the one-rank model's tokens."""
    gguf = pytest.importorskip("gguf")
    from helpers.lora_adapters import AdapterSpec, make_adapter
    from helpers.lora_gguf import write_gguf_adapter

    spec = (AdapterSpec(targets=("qkv_proj", "o_proj", "gate_up_proj", "down_proj"), seed=4) if base == "phi3_f32"
            else AdapterSpec(seed=1))
    peft = make_adapter(tiny_models.path(base), tmp_path / "peft", spec)
    path = write_gguf_adapter(peft, tmp_path / "adapter.gguf", "phi3" if base == "phi3_f32" else "llama",
                              gguf.GGMLQuantizationType.F32)
    model = llaisys_models.load(tiny_models.path(base), device="cpu", tensor_parallel=2)
    try:
        whole = llaisys_models.load(tiny_models.path(base), device="cpu")
        for m in (model, whole):
            m.load_lora("gguf", path)
            m.load_lora("peft", peft)
        ids = prompt(base, 13, SPECS[base].vocab)
        for lora in ("gguf", "peft"):
            got = model.generate(ids, NEW, lora=lora, eos_token_ids=())
            assert got == whole.generate(ids, NEW, lora=lora, eos_token_ids=()), lora
        assert got != model.generate(ids, NEW, eos_token_ids=())
    finally:
        model.close()


def test_through_a_communicator(tiny_models, adapters, device):
    """The messages and the all-gather of a load on the device's collectives: on the CPU a group of one (what a
    machine with one GPU runs), on an accelerator every device of its kind up to 2 (tools/gpu_check.sh), against
    the model on its first device alone."""
    import llaisys
    from llaisys_models.parallel.launch import load_parallel

    if device.index not in (None, 0):
        pytest.skip(f"a group starts at {device.type}:0")
    base = "f32_gqa2_hd32"
    ranks = 1 if device.type == "cpu" else len([d for d in llaisys.available_devices() if d.type == device.type])
    try:
        model = load_parallel(tiny_models.path(base), min(ranks, 2), device=str(device))
    except llaisys.NotSupportedError as e:
        pytest.skip(f"{device.type} has no collectives here: {e}")
    try:
        whole = llaisys_models.load(tiny_models.path(base), device=str(device))
        for m in (model, whole):
            with_adapters(m, adapters, base)
        prompts = [prompt(base, n, SPECS[base].vocab) for n in LENGTHS]
        names = [None, "a", "b"]
        assert (model.generate_batch(prompts, NEW, lora=names, eos_token_ids=())
                == whole.generate_batch(prompts, NEW, lora=names, eos_token_ids=()))
    finally:
        model.close()


def test_messages_round_trip():
    """LORA_LOAD's name and path packed into words (any length, UTF-8, a path's own bytes), and a STEP with each
    row's slot and two layer groups' slots and tables, decode to what was sent, in order."""
    from llaisys_models.engine.step_inputs import HostStep
    from llaisys_models.parallel.messages import Op, command, decode, lora_load_command, step_command

    i64, i32 = np.int64, np.int32
    host = HostStep(np.arange(5, dtype=i64), np.arange(5, dtype=i64), np.arange(10, dtype=i64).reshape(2, 5),
                    np.arange(12, dtype=i32).reshape(2, 2, 3), np.array([3, 2], i32), np.array([0, 3, 5], i32), None,
                    (1, 1), np.array([-1, -1, -1, 0, 0], i64))
    path = "/tmp/adapters/sql \u00e9t\u00e9 \udcff"  # (an undecodable byte, as os.fsdecode gives it)
    words = np.concatenate([command(Op.LORA_ENABLE, 4, 16), lora_load_command(9, "s\u00e9", path),
                            command(Op.LORA_PLACE, 2, 9), step_command(3, host), command(Op.LORA_FORGET, 9)])
    got = list(decode(words))
    assert [op for op, _ in got] == [Op.LORA_ENABLE, Op.LORA_LOAD, Op.LORA_PLACE, Op.STEP, Op.LORA_FORGET]
    assert got[0][1] == (4, 16) and got[1][1] == (9, "s\u00e9", path) and got[2][1] == (2, 9)
    pool, step = got[3][1]
    assert pool == 3 and step.logits_of == (1, 1) and step.logit_rows is None
    np.testing.assert_array_equal(step.adapters, host.adapters)
    np.testing.assert_array_equal(step.slots, host.slots)
    np.testing.assert_array_equal(step.block_tables, host.block_tables)
    assert list(decode(step_command(3, HostStep(*[getattr(host, f) for f in ("tokens", "positions", "slots")],
                                                host.block_tables, host.seq_lens, host.query_start, None,
                                                None))))[0][1][1].adapters is None
