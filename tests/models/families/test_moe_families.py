"""Mixture-of-experts families against HF transformers on tiny random checkpoints that transformers writes.

Greedy generation follows HF's token for token (f32), within the near-tie rule in bf16 and its
mixture-of-experts form (moe_routing.py: a divergence explained by near-tied router choices), teacher-forced
(test_parity.check_against_reference); a batch of prompts decodes as each prompt alone, in int8 too; int8
experts stay within test_int8's stated error of HF; GGUF files (Mixtral's llama layout, qwen3moe) compute
what their directories do, and a Qwen3-MoE file what transformers computes reading it; a config whose expert
fields contradict each other, and a device without the kernels, are refused naming the field or the kernels.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import llaisys
import llaisys_models
from helpers import skip_without_kernels
from helpers.moe_gguf import write_moe_gguf
from helpers.moe_routing import explain_by_routing, routing_differences
from helpers.parity_rule import MAX_NEAR_TIE_RATE, check_against_reference, near_tie
from helpers.tiny_models import MOE_SPECS, NEW_TOKENS, PROMPT_LENGTHS, Spec, make_checkpoint, prompt
from llaisys_models.errors import ModelLoadError

pytestmark = pytest.mark.slow


def routing_rule(model, tiny_models, name: str, dtype: str):
    """check_against_reference's ``routing``: the near-tie rule's MoE form against HF on checkpoint ``name``
    in ``dtype`` (and its float64 copy)."""
    hf, exact = tiny_models.hf(name, dtype), tiny_models.hf(name, "f64")
    return lambda context, mine, hf_token, where: explain_by_routing(model, hf, exact, context, mine, hf_token,
                                                                     dtype, where)


@pytest.mark.parametrize("name", list(MOE_SPECS))
def test_moe_greedy_matches_hf(name, tiny_models, device):
    model = llaisys_models.load(tiny_models.path(name), device=device)
    assert type(model).__name__ == {"mixtral": "Mixtral", "qwen3_moe": "Qwen3Moe"}[MOE_SPECS[name].arch]
    dtype, ties = MOE_SPECS[name].dtype, {}
    for length in PROMPT_LENGTHS:
        ties[length] = check_against_reference(model, tiny_models.reference(name, length), dtype,
                                               routing_rule(model, tiny_models, name, dtype))
    print(f"{name}: near-ties by prompt length: {ties}")
    steps = len(PROMPT_LENGTHS) * NEW_TOKENS
    assert sum(map(len, ties.values())) <= MAX_NEAR_TIE_RATE[dtype] * steps, ties


def test_near_tied_routing_explains_what_the_logits_do_not(tiny_models, device):
    """The near-tie rule's MoE form (moe_routing.py), on Mixtral's f32 checkpoint computed in bf16 against HF in
    bf16 along HF's f32 greedy sequence (64-token prompt): at some position the output-logit rule alone fails
    (a near-tied router choice sent a token to another expert: measured at 2 of 103 positions, llaisys' token
    2.6 below HF's maximum logit, the tolerance 0.125), and there the routing rule holds; it refuses the same
    model with a planted bug (two of layer 0's experts swapped in llaisys: HF forced to llaisys' routing no
    longer agrees, or the routing differs beyond a near-tie)."""
    import copy

    import torch

    name = "mixtral_f32"
    model = llaisys_models.load(tiny_models.path(name), device=device, dtype="bfloat16")
    hf = tiny_models.hf(name, "bf16")
    exact = copy.deepcopy(hf).to(torch.float64)  # the bf16-rounded weights, exactly
    sequence = tiny_models.reference(name, 64).tokens[:-1]
    with torch.no_grad():
        theirs = hf(torch.tensor([sequence])).logits[0].double().numpy()
        exact_logits = exact(torch.tensor([sequence])).logits[0].numpy()

    def explained(model) -> tuple[int, int]:
        """(divergences of the argmax along the sequence, those the logits alone do not explain); raises for
        one that the routing rule does not explain either."""
        ours, by_routing = model.logits(sequence), 0
        divergent = np.nonzero(ours.argmax(1) != theirs.argmax(1))[0]
        for p in divergent:
            mine, hf_token, where = int(ours[p].argmax()), int(theirs[p].argmax()), f"position {p}"
            try:
                near_tie(theirs[p], exact_logits[p], mine, hf_token, "bf16", where)
            except AssertionError:
                explain_by_routing(model, hf, exact, sequence[:p + 1], mine, hf_token, "bf16", where)
                by_routing += 1
        return len(divergent), by_routing

    divergences, by_routing = explained(model)
    print(f"bf16 Mixtral vs HF bf16: {divergences} divergent positions of {len(sequence)}, {by_routing} explained "
          f"by routing only")
    assert by_routing >= 1, "the logits explain every divergence: this test no longer exercises the routing rule"
    assert divergences <= 0.1 * len(sequence)  # (measured: 7; HF's f32 sequence, not its bf16 greedy one)

    gate = model.weights.layers[0].experts.gate  # [E, inter, hidden]: experts 0 and 1 trade their gate matrices
    first, second = gate.slice(0, 0, 1).numpy().copy(), gate.slice(0, 1, 2).numpy().copy()
    gate.slice(0, 0, 1).load(second)
    gate.slice(0, 1, 2).load(first)
    with pytest.raises(AssertionError, match="not a near-tie"):
        explained(model)


def test_routing_differences_follow_causality():
    """A first difference is held to the near-tie tolerance, one downstream of it (a later layer, a position at
    or after it) is not; llaisys picking against its own router logits is never a near-tie."""
    e = lambda *rows: np.array(rows)  # noqa: E731  experts [positions, k = 1]
    hf_logits = np.tile([1.0, 0.7, 0.3, 0.0], (3, 1))  # [3 positions, 4 experts]: HF picks expert 0
    our_logits = np.array([[1.0, 0.7, 0.3, 0.0], [0.6, 0.7, 0.3, 0.0], [0.0, 0.1, 0.2, 0.9]])
    hf_experts = [e([0], [0], [0]), e([0], [0], [0])]
    ours = [e([0], [1], [0]), e([0], [0], [3])]  # layer 0 position 1, then layer 1 position 2 (downstream)
    differences = routing_differences([hf_logits] * 2, hf_experts, [our_logits] * 2, ours, "f32")
    assert [d[:3] for d in differences] == [(0, 1, True), (1, 2, False)]
    assert differences[0][3] == pytest.approx(0.1) and differences[1][3] == pytest.approx(0.9)
    against_itself = routing_differences([hf_logits], [e([0], [0], [0])], [hf_logits], [e([0], [1], [0])], "f32")
    assert against_itself[0][3] == np.inf


@pytest.mark.parametrize("name, quantize", [("mixtral_bf16", None), ("mixtral_bf16", "int8"),
                                            ("qwen3_moe_f32", "int8"), ("qwen3_moe_f32", "int4")])
def test_moe_batch_decodes_as_each_prompt_alone(name, quantize, tiny_models, device):
    """Rows of a batch pick their experts and sum their outputs on their own: the same tokens either way. (int4:
    the dense linears in q4_0, the lm_head in q8_0, the experts in int8: there is no 4-bit expert kernel.)"""
    if quantize:
        kernels = ["linear_i8", "moe_linear_i8"] + (["linear_q"] if quantize == "int4" else [])
        skip_without_kernels(device, kernels, f"quantize={quantize!r} experts")
    model = llaisys_models.load(tiny_models.path(name), device=device, quantize=quantize)
    if quantize == "int4":
        assert model.weight_formats == ("int8", "q4_0", "q8_0")
    prompts = [prompt(name, n, MOE_SPECS[name].vocab) for n in (5, 17, 30)]
    batched = model.generate_batch(prompts, 12, eos_token_ids=())
    assert batched == [model.generate(p, 12, eos_token_ids=()) for p in prompts]


@pytest.mark.parametrize("field, value, message", [
    ("num_experts_per_tok", 9, "'num_experts_per_tok' = 9 exceeds num_local_experts = 8"),
    ("num_local_experts", 0, "'num_local_experts' must be a positive integer"),
    ("num_experts_per_tok", None, "'num_experts_per_tok' is missing"),
])
def test_moe_config_contradictions_are_refused(tiny_models, tmp_path, field, value, message):
    directory = tmp_path / "bad"
    shutil.copytree(tiny_models.path("mixtral_f32"), directory)
    raw = json.loads((directory / "config.json").read_text())
    if value is None:
        raw.pop(field)
    else:
        raw[field] = value
    (directory / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError, match=message):
        llaisys_models.load(directory, device="cpu")


def test_mixtral_from_a_gguf_file_matches_hf(tiny_models, tmp_path, device):
    """transformers' GGUF loader does not read Mixtral (arch llama with experts), so the reference is HF on
    the checkpoint the file was written from: an F32 file holds its weights exactly. Quantized at load, the
    file's experts become the int8 experts the directory's do, bit for bit."""
    name = "mixtral_f32"
    path = write_moe_gguf(tiny_models.path(name), tmp_path / "mixtral.gguf")
    model = llaisys_models.load(path, device=device)
    assert type(model).__name__ == "Mixtral" and model.config.num_experts == 8
    ties = check_against_reference(model, tiny_models.reference(name, 13), "f32")
    assert len(ties) <= MAX_NEAR_TIE_RATE["f32"] * NEW_TOKENS, ties
    if llaisys.ops.implemented("moe_linear_i8", device):
        ids = prompt(name, 40, MOE_SPECS[name].vocab)
        np.testing.assert_array_equal(llaisys_models.load(path, device=device, quantize="int8").logits(ids),
                                      llaisys_models.load(tiny_models.path(name), device=device,
                                                          quantize="int8").logits(ids))


# A Qwen3-MoE that transformers' GGUF loader reads back: it maps no key to moe_intermediate_size, so the experts'
# width must be its default, 768 (as the released Qwen3-30B-A3B's); llama.cpp renormalises the top-k weights
# (norm_topk_prob, which transformers' loader sets too), and every layer is sparse.
HF_READS_QWEN3_MOE = Spec(arch="qwen3_moe", dtype="f32", hidden=64, inter=128, heads=2, kv_heads=1, head_dim=64,
                          layers=2, experts=4, top_k=2, moe_inter=768, norm_topk=True, seed=12)


def test_qwen3_moe_from_a_gguf_file(tmp_path, device):
    """A qwen3moe F32 file as llama.cpp's converter writes it computes what its directory computes (the same
    logits, bit for bit, so the same tokens; int8 experts quantized from the file as from the directory), and
    greedy decoding follows transformers reading the file token for token."""
    from helpers.hf_gguf import hf_reference

    directory = make_checkpoint(tmp_path / "qwen3_moe", HF_READS_QWEN3_MOE)
    path = write_moe_gguf(directory, tmp_path / "qwen3moe.gguf")
    model = llaisys_models.load(path, device=device)
    assert type(model).__name__ == "Qwen3Moe" and model.dtype.name == "float32"
    c = model.config
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, c.norm_topk_prob, c.sparse_layers) == \
        (4, 2, 768, True, (0, 1))
    ids = prompt("qwen3moe", 13, HF_READS_QWEN3_MOE.vocab)
    from_dir = llaisys_models.load(directory, device=device)
    np.testing.assert_array_equal(model.logits(ids), from_dir.logits(ids))
    assert model.generate(ids, 16, eos_token_ids=()) == from_dir.generate(ids, 16, eos_token_ids=())
    if llaisys.ops.implemented("moe_linear_i8", device):
        np.testing.assert_array_equal(llaisys_models.load(path, device=device, quantize="int8").logits(ids),
                                      llaisys_models.load(directory, device=device, quantize="int8").logits(ids))
    # (MoE experts as HF's eager loop: its default grouped_mm has no float64, which the exact logits need)
    ties = check_against_reference(model, hf_reference(path, ids, experts_implementation="eager"), "f32")
    assert len(ties) <= 1, f"near-ties at steps {ties}"


@pytest.mark.parametrize("case, message", [
    ("dense layer", r"'blk\.1\.ffn_gate_inp\.weight' is missing \(that layer's MLP is dense"),
    ("weights scale", r"qwen3moe\.expert_weights_scale = 2\.5 .* is not supported"),
    ("no expert count", r"qwen3moe\.expert_count \(num_experts\) is missing"),
])
def test_qwen3_moe_gguf_files_llaisys_does_not_run_are_refused(tiny_models, tmp_path, case, message):
    """What llama.cpp's qwen3moe does not run either (a dense layer: the converter's file of a checkpoint with
    mlp_only_layers), or runs otherwise (a factor on the expert weights), or a file without its experts' count,
    is a one-line ModelLoadError naming the tensor or key."""
    import gguf

    name = "qwen3_moe_f32" if case == "dense layer" else "qwen3_moe_bf16"  # (qwen3_moe_f32's layer 1 is dense)
    extra = {"weights scale": {"qwen3moe.expert_weights_scale": 2.5},
             "no expert count": {"qwen3moe.expert_count": (0, gguf.GGUFValueType.UINT32)}}.get(case)
    path = write_moe_gguf(tiny_models.path(name), tmp_path / "bad.gguf", extra=extra)
    if case == "no expert count":  # a key of value 0 reads as absent to llama.cpp's loader: drop it instead
        path = without_key(path, tmp_path / "bad-no-count.gguf", "qwen3moe.expert_count")
    with pytest.raises(ModelLoadError, match=message):
        llaisys_models.load(path, device="cpu")


def without_key(path, out, key: str):
    """A copy of the GGUF file at ``path`` without metadata ``key``."""
    import gguf

    reader = gguf.GGUFReader(path)
    writer = gguf.GGUFWriter(out, reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name == key or field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        sub = field.types[1] if len(field.types) > 1 else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.asarray(t.data), raw_shape=tuple(reversed(t.shape.tolist())),
                          raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@pytest.mark.parametrize("name", ["mixtral_bf16", "qwen3_moe_bf16"])
def test_int8_experts_stay_within_the_int8_error(name, tiny_models, device):
    """quantize="int8": the dense linears and every expert in int8 (moe_linear_i8), the routers and the
    embedding in the model dtype. Against HF's bf16 forward along HF's greedy sequence (103 positions), held
    to test_int8's stated int8 error, in its MoE form: a rounding difference can flip a near-tied routing
    choice, which changes that position's logits wholesale (llaisys' own bf16 Mixtral f32 checkpoint is 0.79
    off HF's bf16 at one of 103 positions), so the measures are the median relative logit error (<= test_int8's
    mean bound) and the argmax agreement (>= its bound). Measured on this CPU (median, agreement): Mixtral
    0.044, 0.903 (llaisys bf16 0.014, 0.961); Qwen3-MoE 0.031, 0.971 (bf16 0.027, 0.951); the f32 checkpoints
    in bf16 + int8: Mixtral 0.044, 0.874, Qwen3-MoE (a dense layer) 0.035, 0.932."""
    import torch

    from helpers.int8_quality import MEAN_RELATIVE_ERROR, MIN_ARGMAX_AGREEMENT, relative_errors
    from llaisys_models.loading.quantize import Int8Experts, Int8Weight

    skip_without_kernels(device, ["linear_i8", "moe_linear_i8"], "quantize='int8' experts")
    sequence = tiny_models.reference(name, 64).tokens[:-1]
    with torch.no_grad():
        want = tiny_models.hf(name, "bf16")(torch.tensor([sequence])).logits[0].float().numpy()
    model = llaisys_models.load(tiny_models.path(name), device=device, dtype="bfloat16", quantize="int8")
    layer = model.weights.layers[0]
    c = model.config
    assert isinstance(layer.q_proj, Int8Weight) and layer.experts.router.dtype == model.dtype
    for matrices, (n, k) in ((layer.experts.gate, (c.moe_intermediate_size, c.hidden_size)),
                             (layer.experts.down, (c.hidden_size, c.moe_intermediate_size))):
        assert isinstance(matrices, Int8Experts) and matrices.shape == (c.num_experts, n, k)
        assert matrices.weight.shape == (c.num_experts, *llaisys.ops.int8_shapes(n, k)[0])
    got = model.logits(sequence)
    err = relative_errors(got, want)
    agreement = np.mean(got.argmax(axis=1) == want.argmax(axis=1))
    print(f"int8 {name}: relative logit error median {np.median(err):.4f} (max {err.max():.4f}), argmax "
          f"agreement {agreement:.3f}")
    assert np.median(err) <= MEAN_RELATIVE_ERROR, (np.median(err), agreement)
    assert agreement >= MIN_ARGMAX_AGREEMENT, agreement


def test_int8_experts_match_the_quantizer(tiny_models):
    """Each expert's int8 blocks are the quantizer's of that expert's checkpoint matrix (quantize.quantize, the
    format test_int8 checks against its formula), whichever expert and matrix."""
    from safetensors.torch import load_file

    from llaisys_models.loading.quantize import quantize

    name = "qwen3_moe_bf16"
    model = llaisys_models.load(tiny_models.path(name), device="cpu", quantize="int8")
    state = load_file(tiny_models.path(name) / "model.safetensors")
    for layer in (0, 1):
        for field, hf in (("gate", "gate_proj"), ("down", "down_proj")):
            stacked = getattr(model.weights.layers[layer].experts, field)
            for e in (0, 5, 7):
                q, scales = quantize(state[f"model.layers.{layer}.mlp.experts.{e}.{hf}.weight"].float().numpy())
                blocks, block_scales = llaisys.ops.pack_int8(q, scales)
                np.testing.assert_array_equal(stacked.weight.numpy()[e], blocks)
                np.testing.assert_array_equal(stacked.scales.numpy()[e].view(np.uint16), block_scales.view(np.uint16))


def cpu_without(monkeypatch, ops: tuple[str, ...]) -> None:
    """The CPU backend as one without the kernels ``ops`` (CUDA today: no int8 kernels)."""
    registry = llaisys.plugins.registry()
    cpu = registry.backend("cpu")
    real = cpu.kernel
    monkeypatch.setattr(cpu, "kernel", lambda op: None if op in ops else real(op))
    monkeypatch.setattr(registry, "_kernels", {})  # resolve again, through the patched backend


def test_a_device_without_int8_experts_is_refused_naming_the_kernel(tiny_models, tmp_path, monkeypatch):
    """A backend with linear_i8 but not moe_linear_i8 runs a dense model in int8, not a MoE model: refused at
    load (from a directory or a GGUF file), naming the kernel; the float model still loads."""
    name = "mixtral_bf16"
    path = write_moe_gguf(tiny_models.path(name), tmp_path / "m.gguf")
    cpu_without(monkeypatch, ("moe_linear_i8",))
    for source in (tiny_models.path(name), path):
        with pytest.raises(llaisys.BackendUnavailableError) as e:
            llaisys_models.load(source, device="cpu", quantize="int8")
        assert "quantize='int8' needs the moe_linear_i8 kernel" in str(e.value) and "'cpu' backend" in str(e.value)
        with pytest.raises(llaisys.BackendUnavailableError, match="moe_linear_i8"):
            llaisys_models.load(source, quantize="int8")  # no device can run it
    assert llaisys_models.load(tiny_models.path(name), device="cpu").quantize is None
    assert llaisys_models.load(tiny_models.path("f32_gqa2_hd32"), device="cpu", quantize="int8").quantize == "int8"


def test_a_device_without_the_moe_kernels_is_refused_naming_them(tiny_models, monkeypatch):
    """A backend without the MoE ops runs dense models, not MoE ones: refused at load naming the ops, never
    in the middle of a forward."""
    cpu_without(monkeypatch, ("moe_router", "moe_combine"))
    with pytest.raises(llaisys.BackendUnavailableError,
                       match="'cpu' backend does not implement moe_router, moe_combine, which the model needs;"):
        llaisys_models.load(tiny_models.path("qwen3_moe_bf16"), device="cpu")
    with pytest.raises(llaisys.BackendUnavailableError, match="moe_router"):
        llaisys_models.load(tiny_models.path("qwen3_moe_bf16"))  # no device can run it
    assert llaisys_models.load(tiny_models.path("f32_gqa2_hd32"), device="cpu").config.num_experts == 0


# ---- a GGUF file's quantized experts kept in their blocks (moe_linear_q) --------------------------------------

# A Qwen3-MoE whose matrices are all 256 wide, so its experts can be stored in every block format (the K formats'
# super-blocks are 256): hidden 256, 8 experts of 256, top 2.
BLOCKS_QWEN3_MOE = Spec(arch="qwen3_moe", dtype="f32", hidden=256, inter=256, heads=4, kv_heads=2, head_dim=64,
                        layers=2, experts=8, top_k=2, moe_inter=256, norm_topk=True, seed=13)
EXPERT_FORMATS = ("q8_0", "q4_0", "q4_1", "q4_k", "q6_k")


@pytest.fixture(scope="module")
def blocks_moe_directory(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("blocks_moe"), BLOCKS_QWEN3_MOE)


def blocks_moe_file(directory, tmp_path, fmt: str):
    import gguf

    return write_moe_gguf(directory, tmp_path / f"experts-{fmt}.gguf",
                          experts_qtype=gguf.GGMLQuantizationType[fmt.upper()])


# The blocks model against the same file decoded to float32, teacher-forced along the latter's greedy tokens: its
# only error is the experts' inputs quantized to int8 per 32 (as linear_q's), which can also flip a near-tied
# routing choice and so change a position's logits wholesale (test_int8_experts_stay_within_the_int8_error). So:
# the median relative logit error within test_gguf's mean bound for block linears, its argmax agreement bound, and
# every position where the argmaxes differ a near-tie: the blocks' choice within NEAR_TIE_NOISE times the
# position's rms logit error (the noise the int8 inputs add) of the exact maximum. Measured on this CPU (median,
# max, agreement; 28 positions): q8_0 0.015, 0.021, 1.0; q4_0 0.016, 0.021, 0.96 (0.16x); q4_1 0.014, 0.34, 1.0;
# q4_k 0.011, 0.39, 1.0; q6_k 0.013, 0.019, 0.93 (its two flips 0.16x and 2.2x the rms error); Mixtral's q4_0
# 0.010, 0.14, 0.96 (3.2x); greedy tokens identical but for q6_k and Mixtral's.
MEDIAN_RELATIVE_ERROR = 0.08
MIN_ARGMAX_AGREEMENT = 0.75
NEAR_TIE_NOISE = 4.0


@pytest.mark.parametrize("fmt", EXPERT_FORMATS)
def test_gguf_experts_stay_in_their_blocks(blocks_moe_directory, tmp_path, fmt, device):
    """A file's quantized experts stay in their blocks (the rest of this file is F32): each stacked tensor takes
    its blocks' bytes, the file's own (Q4_K: 4.625 bits a weight for the file's 4.5, its two levels of scales),
    and the model decodes greedily as the same file decoded to float32 does, within the rule above."""
    skip_without_kernels(device, ["moe_linear_q"], "a GGUF file's experts in their blocks")
    check_blocks_against_decoded(blocks_moe_file(blocks_moe_directory, tmp_path, fmt), fmt, "qwen3moe",
                                 BLOCKS_QWEN3_MOE.vocab, device)


def test_mixtral_gguf_experts_stay_in_their_blocks(tiny_models, tmp_path, device):
    """Mixtral's layout (arch llama, Q / K rows permuted): its Q4_0 experts in their blocks, the same rule."""
    import gguf

    skip_without_kernels(device, ["moe_linear_q"], "a GGUF file's experts in their blocks")
    name = "mixtral_f32"
    path = write_moe_gguf(tiny_models.path(name), tmp_path / "mixtral-q4_0.gguf",
                          experts_qtype=gguf.GGMLQuantizationType.Q4_0)
    check_blocks_against_decoded(path, "q4_0", name, MOE_SPECS[name].vocab, device)


def check_blocks_against_decoded(path, fmt: str, prompt_name: str, vocab: int, device) -> None:
    from llaisys_models.families.weights import BlockExperts
    from llaisys_models.loading.gguf.reader import GGUFFile

    stored = llaisys_models.load(path, device=device, dtype="float32")
    exact = llaisys_models.load(path, device=device, dtype="float32", dequantize=True)
    assert stored.weight_formats == (fmt,) and exact.weight_formats == ()
    stored_bits = {"q4_k": 4.625 / 4.5}.get(fmt, 1.0)
    f = GGUFFile(path)
    for i, layer in enumerate(stored.weights.layers):
        for part in ("gate", "up", "down"):
            w = getattr(layer.experts, part)
            assert isinstance(w, BlockExperts) and w.fmt == fmt
            held, file_bytes = w.weight.nbytes + w.scales.nbytes, f.tensors[f"blk.{i}.ffn_{part}_exps.weight"].nbytes
            assert held == pytest.approx(file_bytes * stored_bits, rel=1e-9), (i, part, held, file_bytes)
    ids = prompt(prompt_name, 13, vocab)
    tokens = exact.generate(ids, 16, eos_token_ids=())
    ours, want = (np.asarray(m.logits(tokens[:-1]), np.float64) for m in (stored, exact))
    err = np.linalg.norm(ours - want, axis=1) / np.linalg.norm(want, axis=1)
    agreement = np.mean(ours.argmax(-1) == want.argmax(-1))
    same = stored.generate(ids, 16, eos_token_ids=()) == tokens
    print(f"{fmt}: relative logit error median {np.median(err):.4f} max {err.max():.4f}, agreement {agreement:.3f}, "
          f"greedy tokens identical: {same}")
    assert np.median(err) <= MEDIAN_RELATIVE_ERROR and agreement >= MIN_ARGMAX_AGREEMENT, (err, agreement)
    for p in np.flatnonzero(ours.argmax(-1) != want.argmax(-1)):
        gap = want[p].max() - want[p][ours[p].argmax()]
        noise = np.sqrt(np.mean((ours[p] - want[p]) ** 2))
        print(f"  position {p}: exact gap {gap:.4g}, rms logit error {noise:.4g}")
        assert gap <= NEAR_TIE_NOISE * noise, f"position {p}: not a near-tie ({gap:.4g} vs rms error {noise:.4g})"


@pytest.mark.parametrize("fmt", ["q4_k", "q8_0"])
def test_gguf_block_experts_batch_decodes_as_each_prompt_alone(blocks_moe_directory, tmp_path, fmt, device):
    skip_without_kernels(device, ["moe_linear_q"], "a GGUF file's experts in their blocks")
    model = llaisys_models.load(blocks_moe_file(blocks_moe_directory, tmp_path, fmt), device=device)
    prompts = [prompt("qwen3moe", n, BLOCKS_QWEN3_MOE.vocab) for n in (5, 17, 30)]
    batched = model.generate_batch(prompts, 12, eos_token_ids=())
    assert batched == [model.generate(p, 12, eos_token_ids=()) for p in prompts]


def test_gguf_experts_decode_without_moe_linear_q(blocks_moe_directory, tmp_path, monkeypatch):
    """A device without moe_linear_q (or dequantize=True) decodes the experts into the compute dtype, as before:
    the same logits, bit for bit, either way."""
    path = blocks_moe_file(blocks_moe_directory, tmp_path, "q4_0")
    ids = prompt("qwen3moe", 9, BLOCKS_QWEN3_MOE.vocab)
    decoded = llaisys_models.load(path, device="cpu", dequantize=True)
    cpu_without(monkeypatch, ("moe_linear_q",))
    without = llaisys_models.load(path, device="cpu")
    assert without.weight_formats == () and isinstance(without.weights.layers[0].experts.gate, llaisys.Tensor)
    np.testing.assert_array_equal(without.logits(ids), decoded.logits(ids))
