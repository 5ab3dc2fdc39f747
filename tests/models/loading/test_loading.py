"""Loading checkpoints: zero-copy mapping, conversions, shards, and clear errors for bad input."""

from __future__ import annotations

import gc
import json
import mmap
import shutil
import struct

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import llaisys
import llaisys_models
from helpers.tiny_models import SPECS, prompt
from llaisys_models import MODEL_CLASSES, ModelLoadError

BF16 = "bf16_mha_hd64"
F32 = "f32_gqa2_hd32"
SHARDED = "bf16_gqa4_hd128_sharded"


def all_weights(model):
    w = model.weights
    yield "embed_tokens", w.embed_tokens
    yield "norm", w.norm
    yield "lm_head", w.lm_head
    for i, layer in enumerate(w.layers):
        for field, t in vars(layer).items():
            if t is not None:
                yield f"layers.{i}.{field}", t


def mapping_range(mm: mmap.mmap) -> tuple[int, int]:
    base = np.frombuffer(mm, dtype=np.uint8).ctypes.data
    return base, base + len(mm)


@pytest.fixture
def cpu():
    if llaisys.Device("cpu") not in llaisys.available_devices():
        pytest.skip("no cpu device (zero-copy loading is a CPU feature)")
    return llaisys.Device("cpu")


@pytest.mark.parametrize("name", [BF16, SHARDED])
def test_same_dtype_on_cpu_is_zero_copy(name, tiny_models, cpu):
    """With mmap=True, weights stored in the compute dtype point straight into the memory-mapped files."""
    gc.collect()
    before = llaisys.memory_stats("cpu")["allocated_bytes"]
    model = llaisys_models.load(tiny_models.path(name), device=cpu, dtype="bfloat16", mmap=True)
    rope_table = -(-model.rope_inv_freq.nbytes // 512) * 512  # the one buffer a load allocates (in 512-byte units)
    assert llaisys.memory_stats("cpu")["allocated_bytes"] <= before + rope_table, "loading allocated memory"
    ranges = [mapping_range(f.mapping) for f in model.checkpoint.files]
    if name == SHARDED:
        assert len(ranges) > 1, "the sharded checkpoint has a single file"
    for field, t in all_weights(model):
        assert any(lo <= t.data_ptr() and t.data_ptr() + t.nbytes <= hi for lo, hi in ranges), (
            f"{field} was copied out of the mapping")
        assert t.storage.readonly


def test_conversion_copies_once_and_rounds_like_numpy(tiny_models, cpu):
    path = tiny_models.path(BF16)
    model = llaisys_models.load(path, device=cpu, dtype="float32", mmap=True)
    assert model.dtype == llaisys.float32
    (lo, hi), = [mapping_range(f.mapping) for f in model.checkpoint.files]
    embed = model.weights.embed_tokens
    assert not lo <= embed.data_ptr() < hi
    from safetensors.torch import load_file as load_torch
    want = load_torch(str(path / "model.safetensors"))["model.embed_tokens.weight"].float().numpy()
    np.testing.assert_array_equal(embed.numpy(), want)


def test_default_dtype_is_the_stored_one(tiny_models, device):
    assert llaisys_models.load(tiny_models.path(F32), device=device).dtype == llaisys.float32
    assert llaisys_models.load(tiny_models.path(BF16), device=device).dtype == llaisys.bfloat16
    assert llaisys_models.load(tiny_models.path("f16_gqa3_hd64_legacy"), device=device).dtype == llaisys.float16


def test_classes_and_device_choice(tiny_models):
    model = llaisys_models.load(tiny_models.path("llama_f32_tied"))
    assert type(model) is llaisys_models.Llama and not model.config.qkv_bias
    assert model.device == llaisys.available_devices()[0]
    qwen = llaisys_models.Qwen2(tiny_models.path(F32), "cpu")
    assert type(qwen) is llaisys_models.Qwen2 and qwen.config.qkv_bias and str(qwen.device) == "cpu:0"
    assert qwen.config.head_dim == 32 and qwen.config.rope_theta == 10000.0


# -- bad input -------------------------------------------------------------------------

@pytest.fixture
def broken(tiny_models, tmp_path):
    """A writable copy of the f32 checkpoint to break."""
    def copy(name=F32):
        target = tmp_path / name
        shutil.copytree(tiny_models.path(name), target)
        return target
    return copy


def expect_load_error(path, match, **kwargs):
    gc.collect()
    before = llaisys.memory_stats("cpu")["allocated_bytes"] if llaisys.available_devices() else None
    with pytest.raises(ModelLoadError, match=match):
        llaisys_models.load(path, device="cpu", **kwargs)
    if before is not None:  # nothing half-loaded stays behind
        assert llaisys.memory_stats("cpu")["allocated_bytes"] <= before


def edit_config(path, **changes):
    raw = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    (path / "config.json").write_text(json.dumps(raw))


def test_missing_directory(tmp_path):
    expect_load_error(tmp_path / "nope", "does not exist: a model is a directory .* or a GGUF file")


def test_missing_config(broken):
    path = broken()
    (path / "config.json").unlink()
    expect_load_error(path, "config.json")


def test_invalid_config(broken):
    path = broken()
    (path / "config.json").write_text("{not json")
    expect_load_error(path, "not valid JSON")


def test_a_gguf_only_directory_names_the_file(tmp_path):
    (tmp_path / "model-q4_k.gguf").write_bytes(b"GGUF")
    expect_load_error(tmp_path, "config.json does not exist: .*; it holds a GGUF file: pass the file, "
                      f".*{tmp_path.name}/model-q4_k.gguf$")
    (tmp_path / "model-q8_0.gguf").write_bytes(b"GGUF")
    expect_load_error(tmp_path, r"it holds GGUF files: pass one of them \(model-q4_k.gguf, model-q8_0.gguf\)$")


@pytest.mark.parametrize("config, match", [
    ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768, "n_layer": 12},
     # (the registry's architectures, sorted: Gemma3ForCausalLM, LlamaForCausalLM, ..., Qwen3MoeForCausalLM)
     rf"config.json: architecture 'GPT2LMHeadModel' is not supported; llaisys_models runs "
     rf"{', '.join(sorted(MODEL_CLASSES))}$"),
    ({"model_type": "gpt2", "n_embd": 768}, r"architecture \(none; model_type 'gpt2'\) is not supported"),
])
def test_another_architecture_is_named_before_its_fields(tmp_path, config, match):
    """A GPT-2 config has none of the fields a Llama has: the architecture is the problem, not hidden_size."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    expect_load_error(tmp_path, match)


@pytest.mark.parametrize("changes, match", [
    (dict(hidden_size=None), "hidden_size"),
    (dict(num_attention_heads=3), "multiple"),
    (dict(architectures=["GPT2LMHeadModel"]), "GPT2LMHeadModel.*not supported"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}), "yarn"),
    (dict(hidden_act="gelu"), "hidden_act"),
])
def test_bad_config_fields(broken, changes, match):
    path = broken()
    edit_config(path, **changes)
    expect_load_error(path, match)


def test_missing_weights(broken):
    path = broken()
    (path / "model.safetensors").unlink()
    expect_load_error(path, "no weights")


def test_truncated_safetensors(broken):
    path = broken()
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[:len(data) // 2])
    expect_load_error(path, "truncated")
    (path / "model.safetensors").write_bytes(data[:5])
    expect_load_error(path, "truncated")


def test_corrupt_safetensors_header(broken):
    path = broken()
    data = bytearray((path / "model.safetensors").read_bytes())
    (header_len,) = struct.unpack("<Q", data[:8])
    (path / "model.safetensors").write_bytes(bytes(data[:8]) + b"#" * header_len + bytes(data[8 + header_len:]))
    expect_load_error(path, "corrupt")
    (path / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + bytes(data[8:]))
    expect_load_error(path, "corrupt or truncated")


def test_header_offsets_outside_the_file(broken):
    path = broken()
    data = (path / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    name = "model.norm.weight"
    begin, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [begin + 10**9, end + 10**9]
    raw = json.dumps(header).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])
    expect_load_error(path, "model.norm.weight.*truncated or corrupt")


def test_missing_tensor(broken):
    path = broken()
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(path / "model.safetensors"))
    expect_load_error(path, "model.layers.1.mlp.down_proj.weight.*missing")
    expect_load_error(path, "missing", dtype="bfloat16")  # fails before converting anything


def test_wrong_shape(broken):
    path = broken()
    edit_config(path, intermediate_size=SPECS[F32].inter * 2)
    expect_load_error(path, "shape")


def test_missing_shard(broken):
    path = broken(SHARDED)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[-1]
    (path / shard).unlink()
    expect_load_error(path, shard)


def test_bad_dtype_and_device(tiny_models):
    with pytest.raises(llaisys.LlaisysValueError, match="dtype"):
        llaisys_models.load(tiny_models.path(F32), device="cpu", dtype="int8")
    with pytest.raises(llaisys.BackendUnavailableError, match="nosuchdevice"):
        llaisys_models.load(tiny_models.path(F32), device="nosuchdevice")


def test_no_device_says_why(tiny_models, monkeypatch):
    """With every backend disabled, load() says so (core's why_no_device), not "install llaisys-backend-cpu"."""
    with pytest.warns(llaisys.LlaisysWarning, match="nosuchbackend"):  # an unknown name in LLAISYS_BACKENDS
        registry = llaisys.plugins.Registry(env_filter="nosuchbackend")
    monkeypatch.setattr(llaisys.plugins, "_registry", registry)
    with pytest.raises(llaisys.BackendUnavailableError) as e:
        llaisys_models.load(tiny_models.path(F32))
    assert "disabled by LLAISYS_BACKENDS=nosuchbackend" in str(e.value), str(e.value)
    assert "pip install llaisys-backend" not in str(e.value), "every backend is installed: none to install"


def test_bad_prompts(tiny_models, device):
    model = llaisys_models.load(tiny_models.path(F32), device=device)
    vocab, limit = SPECS[F32].vocab, SPECS[F32].max_pos
    with pytest.raises(ValueError, match="empty"):
        model.generate([], 4)
    with pytest.raises(ValueError, match=r"input_ids\[1\] = -1"):
        model.generate([1, -1], 4)
    with pytest.raises(ValueError, match=rf"input_ids\[0\] = {vocab}\b"):
        model.generate([vocab], 4)
    with pytest.raises(ValueError, match="sequence of token ids"):
        model.generate("hello", 4)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model.generate(prompt(F32, 10, vocab), limit - 9)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model.session().forward([1] * (limit + 1))
    assert len(model.generate(prompt(F32, 10, vocab), 3)) <= 13  # still usable after the errors


def test_model_path_that_is_a_file(tiny_models):
    config = tiny_models.path(F32) / "config.json"
    with pytest.raises(ModelLoadError, match=r"config\.json is a file.*directory.*pass the directory"):
        llaisys_models.load(config, device="cpu")
    with pytest.raises(ModelLoadError, match="is a file"):
        llaisys_models.Qwen2(tiny_models.path(F32) / "model.safetensors", "cpu")


def test_layer_count_is_checked_against_the_checkpoint_first(broken):
    """A corrupt count (10**9 took 28 s, then MemoryError) must not build a plan per layer before the
    tensors are counted. 10**5 here: should this regress, the test fails on the message, not on memory. (A
    layer_types list of the old length would be refused first, by config.py: it goes.)"""
    path = broken()
    edit_config(path, num_hidden_layers=10**5, layer_types=None)
    expect_load_error(path, rf"num_hidden_layers = {10**5}.*{SPECS[F32].layers} layers; layer "
                            rf"{SPECS[F32].layers} is missing")


def rewrite_header(path, edit):
    """Replace the safetensors header of ``path`` by ``edit(header) -> bytes`` (data unchanged)."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    raw = edit(json.loads(data[8:8 + n]))
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])


@pytest.mark.parametrize("edit, match", [
    (lambda h: b'{"a": ' * 50_000 + b"1" + b"}" * 50_000, "nested too deeply"),
    (lambda h: json.dumps(h).replace('"data_offsets": [0,', '"data_offsets": [' + "9" * 5000 + ",", 1).encode(),
     "not valid JSON.*digits"),
    (lambda h: b"\xff" + json.dumps(h).encode()[1:], "not UTF-8"),
])
def test_hostile_safetensors_header(broken, edit, match):
    path = broken()
    rewrite_header(path / "model.safetensors", edit)
    expect_load_error(path, match)


@pytest.mark.parametrize("shard", ["{outside}", "../outside.safetensors", "sub/../../outside.safetensors", 7])
def test_index_never_names_a_file_outside_the_model_directory(broken, shard):
    """An index pointing at a valid checkpoint outside the directory is refused, not opened."""
    path = broken()
    outside = path.parent / "outside.safetensors"
    shutil.copy(path / "model.safetensors", outside)
    names = load_file(str(path / "model.safetensors")).keys()
    shard = str(outside) if shard == "{outside}" else shard
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: shard for n in names}}))
    expect_load_error(path, "not a file name inside the model directory")


def test_mmap_false_copies_the_weights(broken, cpu):
    """mmap=False reads the files into memory: rewriting a file afterwards leaves the model intact."""
    path = broken()
    ids = prompt(F32, 9, SPECS[F32].vocab)
    mapped = llaisys_models.load(path, device=cpu, mmap=True)
    want = mapped.generate(ids, 8, eos_token_ids=())
    del mapped
    gc.collect()
    model = llaisys_models.load(path, device=cpu, mmap=False)
    assert all(f.mapping is None for f in model.checkpoint.files)
    assert not any(t.storage.readonly for _, t in all_weights(model))
    (path / "model.safetensors").write_bytes(b"\0" * 64)  # truncated in place: a mapped model would crash
    assert model.generate(ids, 8, eos_token_ids=()) == want


def test_mapped_weights_are_exported_read_only(tiny_models, cpu):
    """Weights that live in the (read-only) mapping say so through DLPack (numpy honours the flag)."""
    model = llaisys_models.load(tiny_models.path(F32), device=cpu, mmap=True)
    array = np.from_dlpack(model.weights.layers[0].q_proj)
    assert not array.flags.writeable


@pytest.mark.parametrize("name", [BF16, SHARDED])
def test_cpu_default_reads_the_weights_into_memory(name, tiny_models, cpu):
    """The CPU default: each weight read once from the file into its own (writable) buffer, the files not
    kept mapped, and the model computes exactly what the zero-copy mapped one does."""
    path = tiny_models.path(name)
    ids = prompt(name, 7, SPECS[name].vocab)
    model = llaisys_models.load(path, device=cpu, dtype="bfloat16")
    assert all(f.mapping is None for f in model.checkpoint.files)
    assert not any(t.storage.readonly for _, t in all_weights(model))
    mapped = llaisys_models.load(path, device=cpu, dtype="bfloat16", mmap=True)
    for (field, t), (_, m) in zip(all_weights(model), all_weights(mapped)):
        np.testing.assert_array_equal(t.numpy(), m.numpy(), err_msg=field)
    np.testing.assert_array_equal(model.logits(ids), mapped.logits(ids))


def test_a_backend_without_the_paged_kernels_is_refused_when_the_model_loads(tiny_models, monkeypatch):
    """A backend that lacks paged_attention / paged_kv_write (CUDA before it has them) is named at load,
    and device=None passes over it; never a failure in the middle of a forward."""
    registry = llaisys.plugins.registry()

    def drop_paged_kernels(device_type):
        backend = registry.backend(device_type)
        real = backend.kernel
        monkeypatch.setattr(backend, "kernel", lambda op: None if op.startswith("paged_") else real(op))
        monkeypatch.setattr(registry, "_kernels", {})  # resolve again, through the patched backend

    path = tiny_models.path("f32_gqa2_hd32")
    accelerators = sorted({d.type for d in llaisys.available_devices()} - {"cpu"})
    for device_type in accelerators:  # (a CPU-only machine has none: the CPU is the backend without them below)
        drop_paged_kernels(device_type)
        with pytest.raises(llaisys.BackendUnavailableError,
                           match=f"'{device_type}' backend does not implement paged_kv_write, paged_attention"):
            llaisys_models.load(path, device=device_type)
    if accelerators:
        assert llaisys_models.load(path).device.type == "cpu", "device=None should pass over the accelerators"
    drop_paged_kernels("cpu")
    with pytest.raises(llaisys.BackendUnavailableError,
                       match="'cpu' backend does not implement paged_kv_write, paged_attention, which the model"):
        llaisys_models.load(path, device="cpu")
    with pytest.raises(llaisys.BackendUnavailableError, match="does not implement paged_kv_write"):
        llaisys_models.load(path)  # no device can run it
