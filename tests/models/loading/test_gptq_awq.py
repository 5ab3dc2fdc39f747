"""GPTQ and AWQ checkpoints (loading/gptq.py, awq.py, quantized_checkpoint.py), packed here from tiny random
float checkpoints by round-to-nearest (tests/helpers/gptq_awq_pack.py): the packer against an independent unpacker
(llama.cpp's dequant_gptq, AutoAWQ's reverse order), llaisys' unpacking against both, greedy tokens against HF
transformers on the exactly dequantized model in f32 (kept in their groups by linear_gq, and decoded with
dequantize=True), ``infer --test``, the refusals, and a load's peak memory against the checkpoint's size."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import llaisys
import llaisys_models
from helpers import gptq_awq_pack as pack
from helpers.gptq_awq_pack import Quant
from helpers.parity_rule import MAX_NEAR_TIE_RATE, check_against_reference
from helpers.tiny_models import NEW_TOKENS, Reference, greedy_reference, make_checkpoint, prompt
from helpers.tiny_models import SPECS as FLOAT_SPECS
from llaisys_models import ModelLoadError
from llaisys_models.loading import quantized_checkpoint

# name -> (the float checkpoint it is made from, how it is quantized)
CASES = {
    "gptq4_v1_asym_g32": ("f32_gqa2_hd32", Quant(group_size=32)),
    "gptq4_v2_sym_g64_llama": ("llama_f32_tied", Quant(v1=False, sym=True, group_size=64, seed=1)),
    "gptq4_v1_desc_act_g32": ("f32_gqa2_hd32", Quant(desc_act=True, seed=2)),
    "gptq4_v2_desc_act_g64_file": ("f32_mha_hd64_tied", Quant(v1=False, desc_act=True, group_size=64,
                                                              config_file=True, seed=3)),
    "gptq8_v2_whole_rows": ("f32_gqa2_hd32", Quant(bits=8, group_size=-1, v1=False, seed=4)),
    "gptq8_v1_sym_g128_llama": ("llama_f32_tied", Quant(bits=8, sym=True, group_size=128, seed=5)),
    # dynamic: layer 1's MLP kept in float, every other down_proj in 8 bits / groups of 32, the lm_head quantized
    "gptq_dynamic_lm_head": ("f32_gqa2_hd32", Quant(lm_head=True, group_size=64, seed=6, dynamic={
        r"-:model\.layers\.1\.mlp\..*": {}, r"+:.*down_proj": {"bits": 8, "group_size": 32}})),
    "awq_g32": ("f32_gqa2_hd32", Quant(method="awq", seed=7)),
    "awq_g64_llama_file_not_converted": ("llama_f32_tied", Quant(method="awq", group_size=64, config_file=True,
                                                                 seed=8)),
    "awq_g128_not_converted": ("f32_gqa2_hd32", Quant(method="awq", group_size=128, not_converted=("o_proj",),
                                                      seed=9)),
    # other families: Qwen3 (q/k norms, q width 192), Phi-3 (fused qkv_proj / gate_up_proj: row parts of one
    # quantized matrix), Mistral (head_dim 64, sliding window), OLMo 2 (norms after attention and MLP)
    "gptq4_qwen3": ("qwen3_f32", Quant(group_size=64, seed=10)),
    "gptq4_phi3_fused": ("phi3_f32", Quant(group_size=64, desc_act=True, seed=11)),
    "awq_mistral": ("mistral_f32", Quant(method="awq", group_size=32, seed=12)),
    "gptq8_olmo2": ("olmo2_f32", Quant(bits=8, group_size=64, v1=False, seed=13)),
}
PARITY_LENGTH = 13


class Packed:
    """The checkpoints of CASES, made on first use: ``path(case)`` (GPTQ / AWQ) and ``reference(case)`` (the
    same model, its quantized linears' weights the independent unpacker's values, in float32)."""

    def __init__(self, root: Path):
        self.root = root
        self.floats: dict[str, Path] = {}
        self.made: dict[str, tuple[Path, Path]] = {}
        self.refs: dict[tuple[str, int], Reference] = {}
        self.hf: dict[tuple[str, str], object] = {}

    def float_dir(self, spec: str) -> Path:
        if spec not in self.floats:
            directory = self.root / "float" / spec
            directory.mkdir(parents=True)
            self.floats[spec] = make_checkpoint(directory, FLOAT_SPECS[spec])
        return self.floats[spec]

    def dirs(self, case: str) -> tuple[Path, Path]:
        if case not in self.made:
            spec, q = CASES[case]
            out, ref = self.root / case, self.root / f"{case}.reference"
            pack.write_checkpoints(self.float_dir(spec), out, ref, q)
            self.made[case] = (out, ref)
        return self.made[case]

    def path(self, case: str) -> Path:
        return self.dirs(case)[0]

    def reference_dir(self, case: str) -> Path:
        return self.dirs(case)[1]

    def hf_model(self, case: str, dtype: str):
        from transformers import AutoModelForCausalLM

        if (case, dtype) not in self.hf:
            self.hf[case, dtype] = AutoModelForCausalLM.from_pretrained(
                self.reference_dir(case), dtype=getattr(torch, dtype)).eval()
        return self.hf[case, dtype]

    def reference(self, case: str, length: int) -> Reference:
        """HF's greedy tokens and logits on the dequantized float checkpoint (f32, and the exact f64 logits)."""
        if (case, length) not in self.refs:
            ids = prompt(case, length, FLOAT_SPECS[CASES[case][0]].vocab)
            self.refs[case, length] = greedy_reference(self.hf_model(case, "float32"),
                                                       lambda: self.hf_model(case, "float64"), ids)
        return self.refs[case, length]


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Packed:
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    return Packed(tmp_path_factory.mktemp("gptq_awq"))


def _kept_ok(device) -> None:
    if not llaisys.ops.implemented("linear_gq", device):
        pytest.skip(f"the {device.type} backend has no linear_gq kernel")


def _one_line(e: BaseException) -> str:
    text = str(e)
    assert "\n" not in text, f"not one line: {text!r}"
    return text


# -- the packer against the independent unpacker ---------------------------------------------------------------


@pytest.mark.parametrize("q", [Quant(), Quant(v1=False, sym=True, group_size=64), Quant(desc_act=True),
                               Quant(bits=8, group_size=-1), Quant(bits=8, v1=False, group_size=32),
                               Quant(method="awq"), Quant(method="awq", group_size=128)], ids=lambda q: q.name)
@pytest.mark.parametrize("shape", [(8, 32), (24, 128), (64, 256)], ids=str)
def test_packer_writes_what_the_independent_unpacker_reads(q, shape):
    """Packed codes, zeros and scales come back from llama.cpp's / AutoAWQ's unpacking as (q - zero) * scale, and
    round-to-nearest stays within a step of the float weights."""
    if q.group_size > shape[1]:
        pytest.skip("a group wider than the row (GPTQ and AWQ need whole groups)")
    rng = np.random.default_rng(shape[0])
    w = rng.standard_normal(shape) * 0.1
    g_idx = pack.group_index(shape[1], q, rng)
    codes, zeros, scales = pack.rtn(w, q, g_idx)
    tensors = (pack.pack_awq(codes, zeros, scales) if q.method == "awq"
               else pack.pack_gptq(codes, zeros, scales, g_idx, q.bits, q.v1))
    formula = (codes.astype(np.float64) - zeros[:, g_idx]) * scales[:, g_idx].astype(np.float64)
    np.testing.assert_array_equal(pack.dequant(tensors, q), formula)
    assert np.all(np.abs(formula - w) <= scales[:, g_idx].astype(np.float64) * 1.01)
    if q.desc_act and g_idx.max() > 0:
        assert not np.array_equal(g_idx, np.sort(g_idx))  # the groups really are out of order


def test_independent_unpackers_follow_the_published_layouts():
    """Hand-made words: GPTQ's k = 8 i + j at bits 4 j of qweight[i] (zeros minus one in v1); AWQ's output 8c +
    [0, 2, 4, 6, 1, 3, 5, 7][i] at nibble i."""
    qweight = np.full((1, 8), 0x76543210, np.uint32).view(np.int32)  # k = 0..7 of each of 8 outputs: codes 0..7
    qzeros = np.array([[0x00000003]], np.uint32).view(np.int32)  # stored zeros: 3 for output 0, 0 for the others
    scales = np.full((1, 8), 2.0, np.float16)
    w = pack.dequant_gptq(qweight, qzeros, scales, np.zeros(8, np.int32), 4, v1=True)  # v1: zeros 4, 1, 1, ...
    np.testing.assert_array_equal(w[0], [2.0 * (k - 4) for k in range(8)])
    np.testing.assert_array_equal(w[1:], [[2.0 * (k - 1) for k in range(8)]] * 7)
    word = np.array([[0x76543210]], np.uint32).view(np.int32)  # nibble i = i
    codes = pack.dequant_awq(word, np.zeros((1, 1), np.int32), np.ones((1, 8), np.float16), -1)[:, 0]
    np.testing.assert_array_equal(codes, [0, 4, 1, 5, 2, 6, 3, 7])  # output j holds nibble REVERSE[j]


# -- llaisys' unpacking -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_loader_decodes_what_the_independent_unpacker_does(packed, case):
    """Every tensor of llaisys' dequantized state (the HF reference's weights) equals the independent unpacker's
    float32 values bit for bit; each quantized linear unpacks to q in range and zeros < 2^bits."""
    from safetensors.numpy import load_file

    out = packed.path(case)
    ours = quantized_checkpoint.dequantized_state(out)
    theirs = load_file(packed.reference_dir(case) / "model.safetensors")
    assert set(ours) == set(theirs)
    for name in theirs:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    scheme = quantized_checkpoint.read(out)
    assert scheme is not None and scheme.method == CASES[case][1].method
    checkpoint = llaisys_models.Checkpoint(out)
    perms = 0
    for module, linear in quantized_checkpoint._quantized_modules(checkpoint, scheme).items():
        u = linear.unpacked()
        assert u.q.max() < 2 ** u.bits and u.zeros.max() < 2 ** u.bits, module
        if u.perm is not None:  # desc_act: column j is input perm[j], and the groups are contiguous
            perms += 1
            g_idx = checkpoint.tensor(f"{module}.g_idx").numpy()
            np.testing.assert_array_equal(g_idx[u.perm], np.arange(len(g_idx)) // u.group_size)
    assert (perms > 0) == CASES[case][1].desc_act


def test_act_order_with_sorted_groups_needs_no_perm(packed):
    """A GPTQ desc_act checkpoint whose g_idx is k // group_size (what act-order with static groups writes) runs
    without a column order."""
    out = packed.root / "sorted_act_order"
    shutil.copytree(packed.path("gptq4_v1_asym_g32"), out)
    raw = json.loads((out / "config.json").read_text())
    raw["quantization_config"]["desc_act"] = True
    (out / "config.json").write_text(json.dumps(raw))
    scheme = quantized_checkpoint.read(out)
    assert scheme.base.desc_act
    linears = quantized_checkpoint._quantized_modules(llaisys_models.Checkpoint(out), scheme)
    assert linears and all(linear.perm is None for linear in linears.values())


def test_config_is_read_where_each_tool_writes_it(packed):
    gptq = quantized_checkpoint.read(packed.path("gptq4_v2_desc_act_g64_file"))
    assert gptq.source == "quantize_config.json" and not gptq.base.v1 and gptq.base.desc_act
    awq = quantized_checkpoint.read(packed.path("awq_g64_llama_file_not_converted"))
    assert awq.source == "quant_config.json" and (awq.base.bits, awq.base.group_size) == (4, 64)
    dynamic = quantized_checkpoint.read(packed.path("gptq_dynamic_lm_head"))
    assert dynamic.linear("model.layers.1.mlp.up_proj") is None
    assert dynamic.linear("model.layers.0.mlp.down_proj").bits == 8
    assert dynamic.linear("model.layers.1.mlp.down_proj") is None  # the first matching rule decides
    assert dynamic.linear("lm_head").bits == 4
    excluded = quantized_checkpoint.read(packed.path("awq_g128_not_converted"))
    assert excluded.linear("model.layers.0.self_attn.o_proj") is None and excluded.linear("lm_head") is None
    assert quantized_checkpoint.read(packed.float_dir("f32_gqa2_hd32")) is None


# -- parity with HF on the dequantized model --------------------------------------------------------------------


def _parity(model, ref, case) -> None:
    ties = check_against_reference(model, ref, "f32")
    assert len(ties) <= max(1, MAX_NEAR_TIE_RATE["f32"] * NEW_TOKENS), f"{case}: near-ties at {ties}"


@pytest.mark.parametrize("case", CASES)
def test_greedy_matches_hf_on_the_dequantized_model(packed, device, case):
    """Kept in their groups (linear_gq, activations unrounded), the linears compute the dequantized model: greedy
    tokens identical to HF's on it in f32, a near-tie aside."""
    _kept_ok(device)
    model = llaisys_models.load(packed.path(case), device=device)
    method, bits = CASES[case][1].method, CASES[case][1].bits
    assert f"{method}-{bits}bit" in model.weight_formats
    _parity(model, packed.reference(case, PARITY_LENGTH), case)


@pytest.mark.parametrize("case", ["gptq4_v1_desc_act_g32", "awq_g32", "gptq_dynamic_lm_head", "gptq4_phi3_fused"])
def test_dequantize_decodes_the_linears_exactly(packed, device, case):
    """dequantize=True decodes every quantized linear into the compute dtype: f32 logits equal to those of the
    independently dequantized float checkpoint, and HF's greedy tokens."""
    model = llaisys_models.load(packed.path(case), device=device, dequantize=True)
    assert model.weight_formats == ()
    reference = llaisys_models.load(packed.reference_dir(case), device=device)
    ids = prompt(case, 17, 256)
    np.testing.assert_array_equal(model.logits(ids), reference.logits(ids))
    _parity(model, packed.reference(case, PARITY_LENGTH), case)


@pytest.mark.parametrize("case", ["gptq4_v2_sym_g64_llama", "gptq8_v2_whole_rows", "awq_g32"])
@pytest.mark.parametrize("length", [1, 64])
def test_prompt_lengths(packed, device, case, length):
    """Prefill of 1 and 64 tokens and decode steps, in the kept format."""
    _kept_ok(device)
    model = llaisys_models.load(packed.path(case), device=device)
    _parity(model, packed.reference(case, length), case)


def test_hf_reference_of_infer_test_is_the_dequantized_model(packed):
    """``infer --test``'s HF model of a GPTQ directory (cli/parity.load_hf) has the independent unpacker's
    weights."""
    from llaisys_models.cli.parity import load_hf

    model = load_hf(packed.path("gptq4_v1_desc_act_g32"), "float32")
    theirs = packed.hf_model("gptq4_v1_desc_act_g32", "float32").state_dict()
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, theirs[name], rtol=0, atol=0, msg=name)


def test_a_batch_reads_each_row_as_alone(packed, device):
    """Several sequences in one forward (their rows stacked through linear_gq) decode as each does alone."""
    _kept_ok(device)
    model = llaisys_models.load(packed.path("gptq4_v1_desc_act_g32"), device=device)
    prompts = [prompt("batch", n, 256) for n in (3, 17, 40)]
    alone = [model.generate(p, 12, eos_token_ids=()) for p in prompts]
    assert model.generate_batch(prompts, 12, eos_token_ids=()) == alone


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_infer_test_passes_on_a_gptq_directory(packed, device, capsys, dtype):
    """``llaisys infer --test`` on a GPTQ directory: HF on the exactly dequantized model (float16: its weights rounded
    to float16, as HF holds them; the exact logits in float64 from the unrounded values)."""
    _kept_ok(device)
    from llaisys.cli import main

    path = packed.path("gptq4_v2_sym_g64_llama")
    if dtype == "float16":
        path = packed.root / "gptq4_v2_sym_g64_llama.f16"
        if not path.exists():
            pack.write_checkpoints(packed.float_dir("llama_f32_tied"), path, packed.root / "f16.reference",
                                   CASES["gptq4_v2_sym_g64_llama"][1], dtype=np.float16)
    model = llaisys_models.load(path, device=device)
    assert model.dtype.name == dtype
    rc = main(["infer", "--model", str(path), "--device", str(device), "--test", "--raw", "--prompt", "Hello",
               "--max-new-tokens", "12"])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    assert "PASS" in out


# -- refusals ---------------------------------------------------------------------------------------------------


def _edited(packed: Packed, name: str, case: str = "gptq4_v1_asym_g32", config: dict | None = None,
            tensors=None) -> Path:
    """A copy of ``case``'s checkpoint with ``config`` merged into its quantization config and ``tensors(state)``
    applied to its tensors."""
    from safetensors.numpy import load_file, save_file

    out = packed.root / "edited" / name
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(packed.path(case), out)
    if config is not None:
        raw = json.loads((out / "config.json").read_text())
        raw["quantization_config"].update(config)
        (out / "config.json").write_text(json.dumps(raw))
    if tensors is not None:
        state = load_file(out / "model.safetensors")
        tensors(state)
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


L0 = "model.layers.0.self_attn.q_proj"


def _set(name, value):
    def edit(state):
        state[name] = value(state[name]) if callable(value) else value
    return edit


def _g_idx_out_of_range(g):
    g = g.copy()
    g[5] = 99
    return g


def _g_idx_uneven(g):
    g = g.copy()
    g[0] = 1  # group 0 loses a column, group 1 gains one
    return g


REFUSED = {
    "bits 3": (dict(config={"bits": 3}), "bits = 3 is not supported"),
    "group size not dividing K": (dict(config={"group_size": 48}),
                                  f"tensor '{L0}.qweight' in model.safetensors: group_size 48 does not divide its "
                                  f"input width 128"),
    "group size linear_gq cannot take": (dict(config={"group_size": 16}, tensors=None), "linear_gq cannot run it"),
    "g_idx out of range": (dict(tensors=_set(f"{L0}.g_idx", _g_idx_out_of_range)),
                           f"tensor '{L0}.g_idx' holds 99 at column 5, outside the 4 groups"),
    "g_idx uneven": (dict(tensors=_set(f"{L0}.g_idx", _g_idx_uneven)), "columns in group"),
    "qzeros shape": (dict(tensors=_set(f"{L0}.qzeros", np.zeros((2, 16), np.int32))),
                     f"tensor '{L0}.qzeros' in model.safetensors has shape (2, 16)"),
    "scales dtype": (dict(tensors=_set(f"{L0}.scales", lambda s: s.astype(np.float32))),
                     f"tensor '{L0}.scales' in model.safetensors has dtype F32"),
    "qweight missing": (dict(tensors=lambda state: state.pop(f"{L0}.qweight")),
                        f"tensor '{L0}.qweight' is missing"),
    "marlin format": (dict(config={"checkpoint_format": "marlin"}), "checkpoint_format = 'marlin' is not supported"),
    "unknown method": (dict(config={"quant_method": "fp8"}), "quant_method 'fp8' is not one llaisys reads"),
    "bad dynamic pattern": (dict(config={"dynamic": {"-:(": {}}}), "is not a regular expression"),
    "dynamic bits 2": (dict(config={"dynamic": {".*down_proj": {"bits": 2}}}), "bits = 2 is not supported"),
    "awq gemv": (dict(case="awq_g32", config={"version": "gemv"}), "version = 'gemv' is not supported"),
    "awq bits 8": (dict(case="awq_g32", config={"bits": 8}), "bits = 8 is not supported"),
}


@pytest.mark.parametrize("what", REFUSED)
def test_bad_input_is_a_one_line_error(packed, what):
    edits, says = REFUSED[what]
    if what == "group size linear_gq cannot take":
        _kept_ok(llaisys.Device("cpu"))
    path = _edited(packed, what.replace(" ", "_"), **edits)
    with pytest.raises(ModelLoadError) as e:
        llaisys_models.load(path, device="cpu", dequantize=what != "group size linear_gq cannot take")
    assert says in _one_line(e.value)


def test_quantize_on_a_quantized_checkpoint_is_refused(packed):
    with pytest.raises(ModelLoadError) as e:
        llaisys_models.load(packed.path("awq_g32"), quantize="int8")
    text = _one_line(e.value)
    assert "quantized already" in text and "AWQ" in text and "quantize='int8'" in text


def test_a_mixture_of_experts_is_refused(tiny_models, tmp_path):
    directory = tmp_path / "moe"
    shutil.copytree(tiny_models.path("mixtral_f32"), directory)
    raw = json.loads((directory / "config.json").read_text())
    raw["quantization_config"] = Quant().config()
    (directory / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError) as e:
        llaisys_models.load(directory, device="cpu")
    assert "mixture of experts" in _one_line(e.value)


def test_tensor_parallelism_is_refused(packed):
    with pytest.raises(ModelLoadError) as e:
        llaisys_models.load(packed.path("gptq4_v1_asym_g32"), device="cpu", tensor_parallel=2)
    assert "tensor parallelism" in _one_line(e.value)


def test_a_v1_zero_point_past_the_codes_decodes_but_is_not_kept(packed):
    """AutoGPTQ's v1 writes a zero of 0 as -1: stored 15, read back as 16, beyond linear_gq's 4-bit zeros. The
    kept load refuses it naming the tensor; dequantize=True decodes it as llama.cpp does."""
    def wrap(state):
        z = state[f"{L0}.qzeros"].view(np.uint32).copy()
        z[0, 0] |= np.uint32(0xF)  # output 0, group 0: stored 15
        state[f"{L0}.qzeros"] = z.view(np.int32)
        tensors = {f: state[f"{L0}.{f}"] for f in ("qweight", "qzeros", "scales", "g_idx")}
        state["expected"] = np.ascontiguousarray(pack.dequant(tensors, Quant()), np.float32)  # (the loader ignores it)

    path = _edited(packed, "v1_zero_16", tensors=wrap)
    if llaisys.ops.implemented("linear_gq", "cpu"):
        with pytest.raises(ModelLoadError) as e:
            llaisys_models.load(path, device="cpu")
        assert f"tensor '{L0}.qzeros' holds 15 at group 0, output 0" in _one_line(e.value)
    state = quantized_checkpoint.dequantized_state(path)
    expected = state.pop("expected")
    np.testing.assert_array_equal(state[f"{L0}.weight"], expected)
    assert expected[0, :32].max() < 0  # zero 16: every code below it
    llaisys_models.load(path, device="cpu", dequantize=True)


# -- memory ------------------------------------------------------------------------------------------------------


RSS_CHILD = textwrap.dedent("""
    import sys
    import llaisys_models

    def kib(key):
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key))

    open("/proc/self/clear_refs", "w").write("5")  # the peak RSS (VmHWM) starts again from the current RSS
    before = kib("VmRSS:")
    model = llaisys_models.load(sys.argv[1], device="cpu")
    peak = kib("VmHWM:")
    model.logits([1, 2, 3])
    print(before * 1024, peak * 1024)
""")


def test_a_load_peaks_at_about_the_checkpoint_size(tmp_path):
    """Kept in 4 bits and unpacked a linear at a time from the mapped file, a load's peak memory stays near the
    checkpoint's bytes (no float weights are made)."""
    if not llaisys.ops.implemented("linear_gq", "cpu"):
        pytest.skip("the cpu backend has no linear_gq kernel")
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to measure a peak")
    size = pack.random_gptq_checkpoint(tmp_path / "m", hidden=1024, inter=2816, layers=6, heads=16, kv_heads=4,
                                       vocab=8192)
    out = subprocess.run([sys.executable, "-c", RSS_CHILD, str(tmp_path / "m")], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    before, peak = map(int, out.stdout.split()[-2:])
    grew = peak - before
    # the linears alone would take 4x their 4-bit bytes as float16: a load that widened them would pass 2x the file
    assert grew < 1.25 * size + (16 << 20), f"the load raised the peak RSS by {grew >> 20} MiB; the checkpoint is " \
                                            f"{size >> 20} MiB"
