"""Tensor parallelism of a mixture of experts on the CPU: every expert split by rows over 2 ranks (each rank
holds rows [r I'/2, (r+1) I'/2) of each expert's gate and up and those columns of its down, the router whole:
parallel/layout.py), decoding as the model on one rank does.

In f32 the greedy tokens are the one-rank model's (the split moves where the partial sums of each expert's
output are added: a few ulps, far below the tiny models' routing and logit margins); int8 experts are split,
then quantized, so where a rank's part starts on a block of 16 rows and a group of 32 inputs its int8 values are
the one-rank model's to the bit. A GGUF file's experts keep their blocks (rows, and columns that start and end on
a block; columns that would cut a block are decoded).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import llaisys
import llaisys_models
from helpers.moe_gguf import write_moe_gguf
from helpers.tiny_models import MOE_SPECS, make_checkpoint, prompt
from llaisys_models.errors import ModelLoadError
from llaisys_models.families.weights import BlockExperts, Int8Experts
from llaisys_models.parallel.layout import Layout

NAMES = ["qwen3_moe_f32", "mixtral_f32"]  # (Qwen3-MoE: a dense layer among the sparse ones, raw top-k weights)
LENGTHS = (1, 13, 64)
NEW = 20


def greedy_tokens_match(model, whole, name: str) -> None:
    vocab = MOE_SPECS[name].vocab
    for length in LENGTHS:
        ids = prompt(name, length, vocab)
        assert model.generate(ids, NEW, eos_token_ids=()) == whole.generate(ids, NEW, eos_token_ids=()), length
    prompts = [prompt(name, length, vocab) for length in LENGTHS]
    assert model.generate_batch(prompts, NEW, eos_token_ids=()) == whole.generate_batch(prompts, NEW, eos_token_ids=())


@pytest.mark.parametrize("name", NAMES)
def test_f32_greedy_tokens_are_one_rank_s(tiny_models, loaded_models, name):
    model = llaisys_models.load(tiny_models.path(name), device="cpu", tensor_parallel=2)
    try:
        whole = loaded_models("cpu", [name])[name]
        c = MOE_SPECS[name]
        half = c.moe_inter // 2 if c.moe_inter else c.inter // 2
        assert model.config.moe_intermediate_size == half
        sparse = model.config.sparse_layers[0]
        mine, all_of = model.weights.layers[sparse].experts, whole.weights.layers[sparse].experts
        assert mine is not None and all_of is not None
        # rank 0's rows of every expert's gate and up, and those columns of its down; the router whole
        np.testing.assert_array_equal(mine.gate.numpy(), all_of.gate.numpy()[:, :half])
        np.testing.assert_array_equal(mine.up.numpy(), all_of.up.numpy()[:, :half])
        np.testing.assert_array_equal(mine.down.numpy(), all_of.down.numpy()[:, :, :half])
        np.testing.assert_array_equal(mine.router.numpy(), all_of.router.numpy())
        greedy_tokens_match(model, whole, name)
    finally:
        model.close()


def test_int8_experts_are_split_then_quantized(tiny_models):
    name = "qwen3_moe_f32"  # experts of 64 rows: rank 0's 32 rows of gate / up are two whole blocks of 16
    model = llaisys_models.load(tiny_models.path(name), device="cpu", quantize="int8", tensor_parallel=2)
    try:
        whole = llaisys_models.load(tiny_models.path(name), device="cpu", quantize="int8")
        mine, all_of = model.weights.layers[0].experts, whole.weights.layers[0].experts
        assert mine is not None and all_of is not None
        assert isinstance(mine.gate, Int8Experts) and mine.gate.shape == (16, 32, 128)
        assert isinstance(mine.down, Int8Experts) and mine.down.shape == (16, 128, 32)
        np.testing.assert_array_equal(mine.gate.weight.numpy(), all_of.gate.weight.numpy()[:, :2])
        np.testing.assert_array_equal(mine.gate.scales.numpy(), all_of.gate.scales.numpy()[:, :2])
        np.testing.assert_array_equal(mine.down.weight.numpy(), all_of.down.weight.numpy()[:, :, :1])
        np.testing.assert_array_equal(mine.down.scales.numpy(), all_of.down.scales.numpy()[:, :, :1])
        ids = prompt(name, 13, MOE_SPECS[name].vocab)
        assert model.generate(ids, NEW, eos_token_ids=()) == whole.generate(ids, NEW, eos_token_ids=())
    finally:
        model.close()


def test_gguf_experts_keep_their_blocks(tiny_models, tmp_path):
    """A rank's rows of each expert keep the file's blocks, and so do its columns where they start and end on a
    block: Qwen3-MoE's experts of 64 split into 32 rows / columns (Q8_0 blocks of 32 values); the tokens are the
    one-rank model's on the same blocks."""
    from gguf import GGMLQuantizationType

    name = "qwen3_moe_bf16"  # (every layer sparse, as llama.cpp's qwen3moe; the file's other tensors in F32)
    path = write_moe_gguf(tiny_models.path(name), tmp_path / "qwen3moe-q8_0.gguf",
                          experts_qtype=GGMLQuantizationType.Q8_0)
    model = llaisys_models.load(path, device="cpu", tensor_parallel=2)
    try:
        whole = llaisys_models.load(path, device="cpu")
        mine, all_of = model.weights.layers[0].experts, whole.weights.layers[0].experts
        assert mine is not None and all_of is not None
        for field, shape in (("gate", (8, 32, 128)), ("up", (8, 32, 128)), ("down", (8, 128, 32))):
            part, full = getattr(mine, field), getattr(all_of, field)
            assert isinstance(part, BlockExperts) and (part.fmt, part.shape) == ("q8_0", shape), field
            assert isinstance(full, BlockExperts)
        # rows [0, 32) of each expert: its first two blocks of 16 rows, byte for byte
        np.testing.assert_array_equal(mine.gate.weight.numpy(), all_of.gate.weight.numpy()[:, :2])
        np.testing.assert_array_equal(mine.gate.scales.numpy(), all_of.gate.scales.numpy()[:, :2])
        greedy_tokens_match(model, whole, name)
    finally:
        model.close()


def test_gguf_experts_split_on_their_blocks(tiny_models, tmp_path):
    """Mixtral's experts of 96 features are three Q8_0 blocks of 32: rank 0 holds two, rank 1 one, so no rank's
    columns of down cut a block and every part keeps the file's blocks."""
    from gguf import GGMLQuantizationType

    name = "mixtral_f32"  # (llama.cpp's arch llama: permuted q/k rows beside the experts)
    path = write_moe_gguf(tiny_models.path(name), tmp_path / "mixtral-q8_0.gguf",
                          experts_qtype=GGMLQuantizationType.Q8_0)
    model = llaisys_models.load(path, device="cpu", tensor_parallel=2)
    try:
        whole = llaisys_models.load(path, device="cpu")
        assert model.config.moe_intermediate_size == 64
        sparse = model.weights.layers[0].experts
        assert sparse is not None and isinstance(sparse.down, BlockExperts) and sparse.down.shape == (8, 128, 64)
        greedy_tokens_match(model, whole, name)
    finally:
        model.close()


def test_gguf_experts_narrower_than_a_block_a_rank_are_decoded(tmp_path):
    """Experts of 32 features in Q8_0 are one block: split in two, each rank's 16 columns of down would cut it,
    so they are cut from the decoded rows (the one-rank model of the same values: the file decoded)."""
    from gguf import GGMLQuantizationType

    spec = dataclasses.replace(MOE_SPECS["qwen3_moe_bf16"], moe_inter=32)
    directory = make_checkpoint(tmp_path / "narrow", spec)
    path = write_moe_gguf(directory, tmp_path / "narrow-q8_0.gguf", experts_qtype=GGMLQuantizationType.Q8_0)
    model = llaisys_models.load(path, device="cpu", tensor_parallel=2)
    try:
        whole = llaisys_models.load(path, device="cpu", dequantize=True)
        sparse = model.weights.layers[0].experts
        assert sparse is not None and isinstance(sparse.down, llaisys.Tensor) and sparse.down.shape == (8, 128, 16)
        ids = prompt("narrow", 13, spec.vocab)
        assert model.generate(ids, NEW, eos_token_ids=()) == whole.generate(ids, NEW, eos_token_ids=())
    finally:
        model.close()


def test_expert_widths_split_as_evenly_as_their_granules_allow(tiny_models):
    model = llaisys_models.load(tiny_models.path("qwen3_moe_f32"), device="cpu")
    c = dataclasses.replace(model.config, moe_intermediate_size=768)  # (Qwen3-30B-A3B's: three Q4_K blocks of 256)
    assert [Layout(r, 2).expert_width(c) for r in range(2)] == [(0, 384), (384, 768)]
    assert [Layout(r, 2, expert_granule=256).expert_width(c) for r in range(2)] == [(0, 512), (512, 768)]
    assert [Layout(r, 3, expert_granule=256).expert_width(c) for r in range(3)] == [(0, 256), (256, 512), (512, 768)]
    assert Layout(1, 2, expert_granule=256).local_config(c).moe_intermediate_size == 256
    with pytest.raises(ModelLoadError, match=r"cannot be split over 4 ranks: moe_intermediate_size = 3 "):
        Layout.check(dataclasses.replace(c, moe_intermediate_size=3), 4)
