"""GGUF models: llaisys against HF transformers loading the same GGUF file, per quantization type.

Tiny random Qwen2 and Llama checkpoints are written as GGUF files (gguf_files.py), one per type,
and both sides read the same bytes. Loaded with dequantize=True (float32), both hold the exact
dequantized weights, so the logits must agree as closely as with a safetensors checkpoint and greedy
decoding must follow HF's tokens (near-ties as in test_parity, DESIGN §6). Loaded as stored (the
default), the quantized matrices run in their blocks with x quantized per group of 32: the logits stay
within a stated distance of the dequantized file's. Also: the tokenizer built from the metadata against
transformers' own, the CLI on a GGUF file, the progress bar, default dtypes.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

import llaisys
import llaisys_models
from helpers.gguf_files import write_gguf
from helpers.hf_gguf import NEW_TOKENS, hf_reference
from helpers.parity_rule import MAX_NEAR_TIE_RATE, check_against_reference
from helpers.tiny_models import EOS_ID, Reference, Spec, make_checkpoint, prompt
from llaisys_models.loading.gguf import quants

# rows of 256 values, so every k-quant fits: hidden, intermediate and q width multiples of 256
SPECS = {
    "qwen2": Spec(arch="qwen2", vocab=384, hidden=256, inter=512, layers=2, heads=4, kv_heads=2, seed=21),
    "llama": Spec(arch="llama", vocab=320, hidden=256, inter=512, layers=2, heads=4, kv_heads=1, tie=True,
                  seed=22),
}
TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
# every type on qwen2; on llama (un-permuted Q/K rows, no biases, tied output) one of each kind of path:
# plain floats, a legacy block type, a k-quant
CASES = [("qwen2", t) for t in TYPES] + [("llama", t) for t in (Q.F32, Q.F16, Q.Q8_0, Q.Q4_K)]
PROMPT_LENGTH = 13
# The forward pass is test_parity's (40 steps per checkpoint); what a GGUF file adds is the weights,
# the config and the Q/K order, which wrong would part ways at once: 16 steps per type suffice.


class GGUFModels:
    """HF checkpoints, their GGUF files per type and HF's models read back from those files."""

    def __init__(self, root):
        self.root = root
        self._hf, self._files, self._refs = {}, {}, {}

    def hf(self, arch: str):
        from transformers import AutoModelForCausalLM

        if arch not in self._hf:
            directory = self.root / arch
            directory.mkdir()
            make_checkpoint(directory, SPECS[arch])
            self._hf[arch] = (directory, AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval())
        return self._hf[arch]

    def file(self, arch: str, qtype: Q):
        if (arch, qtype) not in self._files:
            directory, hf = self.hf(arch)
            self._files[arch, qtype] = write_gguf(hf, directory, self.root / f"{arch}-{qtype.name}.gguf", qtype)
        return self._files[arch, qtype]

    def reference(self, arch: str, qtype: Q) -> Reference:
        """HF's greedy tokens and logits (float32 and exact float64) from the GGUF file."""
        if (arch, qtype) not in self._refs:
            ids = prompt(arch, PROMPT_LENGTH, SPECS[arch].vocab)
            self._refs[arch, qtype] = hf_reference(self.file(arch, qtype), ids)
        return self._refs[arch, qtype]


@pytest.fixture(scope="module")
def gguf_models(tmp_path_factory) -> GGUFModels:
    return GGUFModels(tmp_path_factory.mktemp("gguf_models"))


@pytest.mark.parametrize("arch,qtype", CASES, ids=lambda v: getattr(v, "name", v))
def test_greedy_matches_hf_reading_the_same_file(gguf_models, arch, qtype, device):
    model = llaisys_models.load(gguf_models.file(arch, qtype), device=device, dtype="float32", dequantize=True)
    assert type(model).__name__ == {"qwen2": "Qwen2", "llama": "Llama"}[arch]
    ties = check_against_reference(model, gguf_models.reference(arch, qtype), "f32")
    assert len(ties) <= max(1, MAX_NEAR_TIE_RATE["f32"] * NEW_TOKENS), f"near-ties at steps {ties}"


def test_the_file_holds_the_checkpoint(gguf_models, device):
    """An F32 GGUF file is the HF checkpoint itself: the same logits as the safetensors directory
    (this checks the Llama Q/K un-permutation against the original weights, not against HF's)."""
    for arch in SPECS:
        directory, _ = gguf_models.hf(arch)
        ids = prompt(arch, PROMPT_LENGTH, SPECS[arch].vocab)
        from_gguf = llaisys_models.load(gguf_models.file(arch, Q.F32), device=device).logits(ids)
        from_dir = llaisys_models.load(directory, device=device).logits(ids)
        np.testing.assert_array_equal(from_gguf, from_dir)


@pytest.mark.parametrize("qtype,dtype", [(Q.F32, "float32"), (Q.F16, "float16"), (Q.BF16, "bfloat16"),
                                         (Q.Q8_0, "float32"), (Q.Q4_K, "float32")], ids=lambda v: str(v))
def test_default_dtype(gguf_models, qtype, dtype):
    """The stored float type; float32 (the exact dequantized values) for quantized weights."""
    model = llaisys_models.load(gguf_models.file("qwen2", qtype), device="cpu", dequantize=True)
    assert model.dtype.name == dtype
    want = quants.dequantize(gguf_models_raw(gguf_models, qtype), qtype, np.empty((384, 256), np.float32))
    np.testing.assert_array_equal(model.weights.embed_tokens.numpy().astype(np.float32),
                                  want.astype(model.dtype.numpy).astype(np.float32))


@pytest.mark.parametrize("arch", list(SPECS))
def test_int8_from_a_gguf_file(gguf_models, arch, device):
    """quantize="int8" on a GGUF file: an F32 file quantizes to the very weights its safetensors checkpoint
    does (Llama's Q/K rows back in HF order, the tied output its own int8 copy); a Q8_0 file keeps its
    integers and moves each group's f16 scale up to a bfloat16 (quantized from its exact decoded values)."""
    from helpers import skip_without_kernels
    from llaisys_models.loading.gguf.reader import GGUFFile
    from llaisys_models.loading.quantize import quantize

    skip_without_kernels(device, ["linear_i8"], "quantize='int8'")
    directory, _ = gguf_models.hf(arch)
    ids = prompt(arch, PROMPT_LENGTH, SPECS[arch].vocab)
    from_gguf = llaisys_models.load(gguf_models.file(arch, Q.F32), device=device, quantize="int8")
    from_dir = llaisys_models.load(directory, device=device, quantize="int8")
    assert from_gguf.quantize == "int8" and from_gguf.weights.lm_head is not from_gguf.weights.embed_tokens
    np.testing.assert_array_equal(from_gguf.logits(ids), from_dir.logits(ids))

    model = llaisys_models.load(gguf_models.file(arch, Q.Q8_0), device=device, quantize="int8")
    raw = GGUFFile(gguf_models.file(arch, Q.Q8_0)).raw("blk.1.ffn_down.weight")
    blocks = raw.reshape(-1, 34)  # Q8_0: an f16 scale, then 32 int8 values
    q8 = blocks[:, 2:].view(np.int8).reshape(raw.shape[0], -1, 32)
    d = blocks[:, :2].view(np.float16).astype(np.float32).reshape(raw.shape[0], -1)
    values = (q8 * d[:, :, None]).reshape(q8.shape[0], -1)  # exact in float32: an f16 times an int8
    want_q, want_scales = quantize(values)
    got = model.weights.layers[1].down_proj
    got_q, got_scales = llaisys.ops.unpack_int8(got.weight.numpy(), got.scales.numpy(), *got.shape)
    np.testing.assert_array_equal(got_q, want_q)
    np.testing.assert_array_equal(got_scales.view(np.uint16), want_scales.view(np.uint16))
    scale = np.repeat(want_scales.astype(np.float32), 32, axis=1)
    assert np.all(np.abs(want_q * scale - values) <= scale / 2)
    # a group whose f16 scale is a bfloat16 already and whose largest integer is +-127 keeps its integers
    kept = (d.astype(ml_dtypes.bfloat16).astype(np.float32) == d) & (np.abs(q8).max(axis=2) == 127)
    assert kept.any()
    np.testing.assert_array_equal(want_q.reshape(q8.shape)[kept], q8[kept])


# What each type becomes as stored: its llaisys block format, or int8 (Q5_*: no format yet, requantized)
STORED = {Q.Q8_0: "q8_0", Q.Q4_0: "q4_0", Q.Q4_1: "q4_1", Q.Q4_K: "q4_k", Q.Q6_K: "q6_k", Q.Q5_0: "int8",
          Q.Q5_1: "int8", Q.Q5_K: "int8"}
# Teacher-forced along the prompt and the dequantized model's 16 greedy tokens (28 positions), per position
# err = ||logits_stored - logits_dequantized|| / ||logits_dequantized||; the bounds are test_int8's (the same
# int8 activations on random, chaotic models). Measured on this CPU (AVX-512 VNNI): max 0.049-0.066, mean
# 0.016-0.033, agreement 0.82-1.00 for the block formats; Q5_* as int8: max 0.058-0.103, mean 0.019-0.045,
# agreement 0.86-1.00. (28 positions: one argmax flip costs 0.036 of agreement.)
MAX_RELATIVE_ERROR = 0.15
MEAN_RELATIVE_ERROR = 0.08
MIN_ARGMAX_AGREEMENT = 0.75


@pytest.mark.parametrize("arch,qtype", [("qwen2", t) for t in STORED] + [("llama", Q.Q4_K), ("llama", Q.Q8_0)],
                         ids=lambda v: getattr(v, "name", v))
def test_stored_blocks_against_the_dequantized_file(gguf_models, arch, qtype, device):
    """As stored (the default), each quantized matrix runs in its block format, the token embedding decoded
    per row read, a tied output in the embedding's own blocks; the logits stay near the dequantized file's
    (float32, the exact weights): x quantized per group of 32 is the blocks' only error (Q5_*: plus their
    requantization to int8)."""
    from helpers import skip_without_kernels

    skip_without_kernels(device, ["linear_q", "embedding_q", "linear_i8"], "a GGUF file's blocks")
    path = gguf_models.file(arch, qtype)
    stored = llaisys_models.load(path, device=device, dtype="float32")
    exact = llaisys_models.load(path, device=device, dtype="float32", dequantize=True)
    kind = STORED[qtype]
    assert kind in stored.weight_formats and exact.weight_formats == ()
    if SPECS[arch].tie and kind != "int8":
        assert stored.weights.lm_head is stored.weights.embed_tokens
    ids = prompt(arch, PROMPT_LENGTH, SPECS[arch].vocab)
    tokens = exact.generate(ids, NEW_TOKENS, eos_token_ids=())
    ours, want = (np.asarray(m.logits(tokens[:-1]), np.float64) for m in (stored, exact))
    err = np.linalg.norm(ours - want, axis=1) / np.linalg.norm(want, axis=1)
    agreement = np.mean(ours.argmax(-1) == want.argmax(-1))
    print(f"{arch} {qtype.name}: relative logit error max {err.max():.4f} mean {err.mean():.4f} agreement {agreement:.3f}")
    assert err.max() <= MAX_RELATIVE_ERROR and err.mean() <= MEAN_RELATIVE_ERROR, f"{err.max():.4f} {err.mean():.4f}"
    assert agreement >= MIN_ARGMAX_AGREEMENT, f"argmax agreement {agreement:.3f}"


def gguf_models_raw(gguf_models, qtype):
    from llaisys_models.loading.gguf.reader import GGUFFile

    return GGUFFile(gguf_models.file("qwen2", qtype)).raw("token_embd.weight")


def test_eos_and_config(gguf_models):
    model = llaisys_models.load(gguf_models.file("llama", Q.Q8_0), device="cpu")
    c = model.config
    assert model.eos_token_ids == (EOS_ID,)
    assert (c.tie_word_embeddings, c.num_key_value_heads, c.head_dim, c.qkv_bias) == (True, 1, 64, False)
    assert model.weights.lm_head is model.weights.embed_tokens
    qwen = llaisys_models.load(gguf_models.file("qwen2", Q.Q8_0), device="cpu").config
    assert (qwen.tie_word_embeddings, qwen.qkv_bias, qwen.rope_theta, qwen.max_position_embeddings) == (
        False, True, 10000.0, 512)


def test_progress_bar_covers_every_weight(gguf_models, monkeypatch):
    from llaisys_models.loading.gguf import weights

    seen = []

    class Recorder(weights.Progress):
        def __init__(self, total, label, enabled=None, **kw):
            super().__init__(total, label, enabled=False, **kw)
            seen.append(self)

    monkeypatch.setattr(weights, "Progress", Recorder)
    model = llaisys_models.load(gguf_models.file("qwen2", Q.Q4_K), device="cpu", progress=True, dequantize=True)
    (bar,) = seen
    assert bar.label == "loading qwen2-Q4_K.gguf" and bar.done == bar.total
    assert bar.total == sum(t.nbytes for t in _all_weights(model))


def _all_weights(model):
    w = model.weights
    yield from (w.embed_tokens, w.norm, w.lm_head)
    for layer in w.layers:
        yield from (t for t in vars(layer).values() if t is not None)


# -- the tokenizer from the metadata ---------------------------------------------------------------

TEXTS = ["Hello, world!", "12+34=", "  spaces\tand\nnewlines  ", "ünïcödé ✓ 中文 🙂", "<|endoftext|> inside"]


@pytest.mark.parametrize("arch", list(SPECS))
def test_tokenizer_matches_transformers_gguf_tokenizer(gguf_models, arch):
    from transformers import AutoTokenizer

    from llaisys_models.text.tokenizer import encode, load_tokenizer

    path = gguf_models.file(arch, Q.Q8_0)
    ours = load_tokenizer(path)
    theirs = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    original = AutoTokenizer.from_pretrained(gguf_models.hf(arch)[0])
    for text in TEXTS:
        ids = ours(text).input_ids
        assert ids == theirs(text).input_ids == original(text).input_ids, text
        assert ours.decode(ids) == theirs.decode(ids) == text
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "12+34="}]
    assert ours.chat_template == original.chat_template
    assert encode(ours, messages) == encode(original, messages)
    assert ours.eos_token == "<|endoftext|>"


# -- the command line --------------------------------------------------------------------------------


def test_cli_generate_and_infer_test_on_a_gguf_file(gguf_models, capsys):
    from llaisys.cli import main
    from llaisys_models.text.tokenizer import encode, load_tokenizer

    path = gguf_models.file("qwen2", Q.Q8_0)
    assert main(["generate", "--model", str(path), "--device", "cpu", "--prompt", "Hi", "--max-new-tokens", "8"]) == 0
    out, err = capsys.readouterr()
    tokenizer = load_tokenizer(path)
    ids = encode(tokenizer, "Hi")
    model = llaisys_models.load(path, device="cpu")
    assert out == tokenizer.decode(model.generate(ids, 8)[len(ids):], skip_special_tokens=True) + "\n"
    assert f"loaded {path} on cpu:0 as float32" in err

    # infer --test runs HF transformers on the same file: identical tokens in float32
    assert main(["infer", "--model", str(path), "--device", "cpu", "--dtype", "float32", "--prompt", "Hi",
                 "--max-new-tokens", "8", "--test"]) == 0, capsys.readouterr().out
    assert "PASS: identical" in capsys.readouterr().out
