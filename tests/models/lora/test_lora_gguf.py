"""llama.cpp GGUF LoRA adapters (lora/gguf.py) against the PEFT adapters they were converted from.

Each PEFT adapter (made with ``peft`` over a tiny random checkpoint: helpers.lora_adapters) is written as
llama.cpp's convert_lora_to_gguf.py writes it (helpers.lora_gguf, checked against the real converter) and both
are loaded into one model: the pairs must be the PEFT ones (exactly from F32; within the stored type's rounding
from F16, BF16, Q8_0), Llama's Q/K lora_b rows put back in HF's order, Phi-3's fused B split, and greedy
generation under the GGUF adapter must be that under the PEFT one, on the HF checkpoint and on a GGUF file of
the same base (whose Q/K rows the base loader un-permutes). A file llaisys cannot apply as an adapter of the
model is refused with one line naming the problem.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

import llaisys_models
from helpers.gguf_files import write_gguf
from helpers.lora_adapters import ADAPTERS, AdapterSpec, make_adapter
from helpers.lora_gguf import write_gguf_adapter
from helpers.tiny_models import ALL_SPECS, prompt
from llaisys_models.errors import ModelLoadError

# base checkpoint -> (its GGUF architecture, the adapter made over it)
BASES = {
    "llama_f32_tied": ("llama", ADAPTERS["all_r8"]),  # Q/K permuted; GQA 4 (K's rows as one head's)
    "f32_gqa2_hd32": ("qwen2", ADAPTERS["all_r8"]),
    # fused qkv_proj and gate_up_proj (PEFT's target names for them): B split into the linears' rows
    "phi3_f32": ("phi3", AdapterSpec(targets=("qkv_proj", "o_proj", "gate_up_proj", "down_proj"), seed=4)),
}
TYPES = (Q.F32, Q.F16, Q.BF16, Q.Q8_0)
NEW_TOKENS = 20


@pytest.fixture(scope="module")
def adapters(tiny_models, tmp_path_factory):
    """``adapters.peft(base)``, ``adapters.gguf(base, qtype, **writer options)``: paths, made on first use."""
    return Adapters(tiny_models, tmp_path_factory.mktemp("gguf_adapters"))


class Adapters:
    def __init__(self, models, root: Path):
        self.models, self.root = models, root
        self._peft: dict[str, Path] = {}
        self._count = 0

    def peft(self, base: str) -> Path:
        if base not in self._peft:
            self._peft[base] = make_adapter(self.models.path(base), self.root / f"{base}-peft", BASES[base][1])
        return self._peft[base]

    def gguf(self, base: str, qtype: Q = Q.F32, arch: str | None = None, **options) -> Path:
        self._count += 1
        path = self.root / f"{base}-{qtype.name}-{self._count}.gguf"
        return write_gguf_adapter(self.peft(base), path, arch or BASES[base][0], qtype, **options)


def load(path: Path):
    return llaisys_models.load(path, device="cpu", dtype="float32")


def assert_same_pairs(gguf, peft, qtype: Q) -> None:
    """The GGUF adapter's pairs are the PEFT adapter's, within what ``qtype`` rounds (Q8_0: lora_a only; the
    converter keeps a lora_b of rank < 32 in F16)."""
    assert gguf.pairs.keys() == peft.pairs.keys()
    for key, expected in peft.pairs.items():
        got = gguf.pairs[key]
        assert got.scale == expected.scale, key
        for half, tolerance in (("a", qtype), ("b", Q.F16 if qtype == Q.Q8_0 else qtype)):
            x, y = getattr(got, half), getattr(expected, half)
            assert x.dtype == np.float32 and x.shape == y.shape, (key, half)
            if tolerance == Q.F32:
                np.testing.assert_array_equal(x, y, err_msg=f"{key} lora_{half}")
            elif tolerance == Q.Q8_0:  # a block's values are d * q, d = its largest magnitude / 127 (f16)
                np.testing.assert_allclose(x, y, rtol=0, atol=np.abs(y).max() / 127, err_msg=f"{key} lora_{half}")
            else:  # F16 / BF16: each value rounded once
                rtol = 2.0 ** -11 if tolerance == Q.F16 else 2.0 ** -8
                np.testing.assert_allclose(x, y, rtol=rtol, atol=1e-7, err_msg=f"{key} lora_{half}")


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("base", BASES)
def test_gguf_adapter_holds_the_peft_pairs(tiny_models, adapters, base, qtype):
    model = load(tiny_models.path(base))
    peft = model.load_lora("p", adapters.peft(base))
    gguf = model.load_lora("g", adapters.gguf(base, qtype))
    assert gguf.targets == peft.targets and gguf.rank == peft.rank == 8
    assert_same_pairs(gguf, peft, qtype)


@pytest.mark.parametrize("base", BASES)
def test_gguf_adapter_generates_as_the_peft_one(tiny_models, adapters, base):
    model = load(tiny_models.path(base))
    model.load_lora("p", adapters.peft(base))
    model.load_lora("g", adapters.gguf(base))
    ids = prompt(base, 13, ALL_SPECS[base].vocab)
    tokens = model.generate(ids, NEW_TOKENS, lora="g")
    assert tokens == model.generate(ids, NEW_TOKENS, lora="p")
    assert tokens != model.generate(ids, NEW_TOKENS)  # (the adapter changes the output)


@pytest.mark.parametrize("base", BASES)
def test_gguf_adapter_on_a_gguf_base(tiny_models, adapters, base, tmp_path):
    """The base read from a GGUF file (Llama's Q/K rows un-permuted by the base loader) and the adapter from
    another: the same pairs and tokens as the PEFT adapter on the HF checkpoint."""
    base_file = write_gguf(tiny_models.hf(base), tiny_models.path(base), tmp_path / "base.gguf", Q.F32)
    on_gguf, on_hf = load(base_file), load(tiny_models.path(base))
    gguf = on_gguf.load_lora("g", adapters.gguf(base))
    assert_same_pairs(gguf, on_hf.load_lora("p", adapters.peft(base)), Q.F32)
    ids = prompt(base, 13, ALL_SPECS[base].vocab)
    assert on_gguf.generate(ids, NEW_TOKENS, lora="g") == on_hf.generate(ids, NEW_TOKENS, lora="p")


@pytest.mark.parametrize("alpha", [0.0, None], ids=["zero", "absent"])
def test_alpha_zero_or_absent_means_scale_one(tiny_models, adapters, alpha):
    """llama.cpp: scale alpha / r, or 1 where adapter.lora.alpha is 0 (as it reads an absent key)."""
    model = load(tiny_models.path("f32_gqa2_hd32"))
    path = adapters.gguf("f32_gqa2_hd32", metadata={"adapter.lora.alpha": alpha})
    assert {pair.scale for pair in model.load_lora("g", path).pairs.values()} == {1.0}


def refused(model, path: Path) -> str:
    with pytest.raises(ModelLoadError) as e:
        model.load_lora("bad", path)
    message = str(e.value)
    assert "\n" not in message and "'bad'" in message
    assert "bad" not in model.loras
    return message


LLAMA = "llama_f32_tied"  # (hidden 128, 4 heads of 32, 1 KV head, intermediate 256, 2 layers)
BAD = {  # writer options -> what the message says
    "wrong architecture": (dict(arch="qwen2"), "an adapter for GGUF architecture 'qwen2', but the base model "
                                               "(LlamaForCausalLM) is 'llama'"),
    "not lora": (dict(metadata={"adapter.type": "control_vector"}),
                 "adapter.type is 'control_vector'; llaisys applies LoRA adapters only"),
    "no adapter type": (dict(metadata={"adapter.type": None}), "it has no adapter.type"),
    "aLoRA": (dict(metadata={"adapter.alora.invocation_tokens": [5, 6]}), "activated LoRA"),
    "negative alpha": (dict(metadata={"adapter.lora.alpha": -1.0}), "adapter.lora.alpha must be a finite number"),
    "missing lora_b": (dict(skip=("blk.1.attn_v.weight.lora_b",)),
                       "blk.1.attn_v.weight: lora_b is missing (the file holds only lora_a)"),
    "missing lora_a": (dict(skip=("blk.0.ffn_down.weight.lora_a",)), "blk.0.ffn_down.weight: lora_a is missing"),
    "rank mismatch": (dict(tensors={"blk.0.attn_q.weight.lora_b": np.ones((128, 4))}),
                      "blk.0.attn_q.weight: lora_A (8, 128) and lora_B (128, 4) are not a pair"),
    "shape mismatch": (dict(tensors={"blk.1.ffn_up.weight.lora_b": np.ones((320, 8))}),
                       "blk.1.ffn_up.weight: the adapter's pair makes [320, 128] but the base model's linear is "
                       "[256, 128]: an adapter for another model"),
    "layer past the base": (dict(tensors={"blk.2.attn_q.weight.lora_a": np.ones((8, 128)),
                                          "blk.2.attn_q.weight.lora_b": np.ones((128, 8))}),
                            "blk.2.attn_q.weight: the base model has 2 layers: an adapter for another model"),
    "token embedding": (dict(tensors={"token_embd.weight.lora_a": np.ones((8, 320)),
                                      "token_embd.weight.lora_b": np.ones((128, 8))}),
                        "tensor 'token_embd.weight.lora_a' adapts the token embedding, which llaisys does not adapt"),
    "output": (dict(tensors={"output.weight.lora_a": np.ones((8, 128))}), "adapts the output (lm_head)"),
    "experts": (dict(tensors={"blk.0.ffn_gate_exps.weight.lora_a": np.ones((8, 128))}),
                "blk.0.ffn_gate_exps.weight: the base model has no such linear"),
    "norm": (dict(tensors={"blk.0.attn_norm.weight": np.ones((1, 128))}), "replaces a norm"),
    "not a lora tensor": (dict(tensors={"blk.0.attn_q.weight": np.ones((128, 128))}),
                          "tensor 'blk.0.attn_q.weight' is not a LoRA pair of a decoder layer's linear"),
    "NaN": (dict(tensors={"blk.0.attn_output.weight.lora_a": np.full((8, 128), np.nan)}),
            "blk.0.attn_output.weight: lora_A holds NaN or infinite values"),
}


@pytest.mark.parametrize("case", BAD)
def test_refused_with_the_reason(tiny_models, adapters, case):
    options, expected = BAD[case]
    message = refused(load(tiny_models.path(LLAMA)), adapters.gguf(LLAMA, **options))
    assert expected in message


def test_a_model_file_is_not_an_adapter(tiny_models, tmp_path):
    model = load(tiny_models.path(LLAMA))
    message = refused(model, write_gguf(tiny_models.hf(LLAMA), tiny_models.path(LLAMA), tmp_path / "m.gguf", Q.F32))
    assert ("is not a llama.cpp adapter (it has no general.type): it holds a model's weights (token_embd.weight), to "
            "load as a model") in message


def test_a_converted_model_is_not_an_adapter(tiny_models, adapters):
    model = load(tiny_models.path(LLAMA))
    message = refused(model, adapters.gguf(LLAMA, metadata={"general.type": "model"}))
    assert "is not a llama.cpp adapter (general.type is 'model', not 'adapter')" in message


def test_an_adapter_of_another_model(tiny_models, adapters):
    """The Qwen2 adapter of one checkpoint on another Qwen2 of other widths (K 64 -> 128 rows)."""
    message = refused(load(tiny_models.path("f32_mha_hd64_tied")), adapters.gguf("f32_gqa2_hd32"))
    assert "blk.0.attn_k.weight: the adapter's pair makes [64, 128] but the base model's linear is [128, 128]" \
           in message


def test_not_a_gguf_file(tiny_models, tmp_path):
    model = load(tiny_models.path(LLAMA))
    (tmp_path / "x.gguf").write_bytes(b"GGUX" + bytes(20))
    assert "is not a GGUF file" in refused(model, tmp_path / "x.gguf")


def test_is_gguf_file(tmp_path):
    from llaisys_models.lora.gguf import is_gguf_file

    (tmp_path / "plain").write_bytes(b"GGUF\x03\x00\x00\x00")
    (tmp_path / "other").write_bytes(b"{}")
    assert is_gguf_file(tmp_path / "plain") and not is_gguf_file(tmp_path / "other")
    assert not is_gguf_file(tmp_path) and not is_gguf_file(tmp_path / "absent.gguf")
