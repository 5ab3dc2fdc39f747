"""Reading GGUF files: the header parser against the gguf package's GGUFReader, and one clear line
for every kind of bad file (truncated, bad magic or version, unknown or unsupported types, an
architecture llaisys does not run, missing tensors or tokenizer, unsupported rope), and for every
size, offset, alignment, nesting or type a malformed file declares (the hostile counts that would
hang or exhaust memory run in a capped child process: tests/robustness/test_gguf_malformed.py)."""

from __future__ import annotations

import shutil
import struct

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

import llaisys_models
from helpers.gguf_files import kv_record, metadata_at, patched, tensor_at, with_records, write_gguf, write_tiny_gguf
from llaisys_models import ModelLoadError
from llaisys_models.families.registry import GGUF_ARCHITECTURES
from llaisys_models.loading.gguf.reader import GGUFFile

MODEL = "f32_gqa2_hd32"  # qwen2, hidden 128: rows of legacy (32-value) blocks

METADATA = [  # (key, value, type, array item type) of every value type GGUF has
    ("t.u8", 200, V.UINT8, None), ("t.i8", -100, V.INT8, None), ("t.u16", 60000, V.UINT16, None),
    ("t.i16", -30000, V.INT16, None), ("t.u32", 4_000_000_000, V.UINT32, None), ("t.i32", -2_000_000_000, V.INT32, None),
    ("t.u64", 2 ** 63 + 5, V.UINT64, None), ("t.i64", -(2 ** 62), V.INT64, None), ("t.f32", 0.5, V.FLOAT32, None),
    ("t.f64", 1e-300, V.FLOAT64, None), ("t.bool", True, V.BOOL, None), ("t.str", "héllo ✓", V.STRING, None),
    ("t.ints", [1, -2, 3], V.ARRAY, V.INT32), ("t.floats", [0.25, -1.5], V.ARRAY, V.FLOAT32),
    ("t.strs", ["a", "", "ü ü"], V.ARRAY, V.STRING), ("t.nested", [[1, 2], [3]], V.ARRAY, V.ARRAY),
]
TENSORS = [("vec", Q.F32, (7,)), ("half", Q.F16, (2, 3, 5)), ("bf", Q.BF16, (4, 6)), ("q8", Q.Q8_0, (3, 64)),
           ("q4k", Q.Q4_K, (2, 256)), ("q6k", Q.Q6_K, (1, 2, 512))]


def write_synthetic(path, alignment: int | None = None):
    writer = gguf.GGUFWriter(path, "test")
    if alignment:
        writer.add_custom_alignment(alignment)
    for key, value, vtype, sub in METADATA:
        writer.add_key_value(key, value, vtype, sub_type=sub)
    rng = np.random.default_rng(0)
    for name, qtype, shape in TENSORS:
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        data = rng.integers(0, 256, size=(*shape[:-1], shape[-1] // block * type_size), dtype=np.uint8)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64])
def test_header_matches_ggufreader(tmp_path, alignment):
    path = write_synthetic(tmp_path / "t.gguf", alignment)
    ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
    # GGUFReader flattens nested arrays (a FIXME of its own); every other value must be equal
    want_meta = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert want_meta.pop("t.nested") == [1, 2, 3] and ours.metadata.pop("t.nested") == [[1, 2], [3]]
    assert ours.metadata == want_meta
    for key, value, vtype, _ in METADATA[:-1]:
        assert ours.metadata[key] == (pytest.approx(value) if vtype == V.FLOAT32 else value)
    assert list(ours.tensors) == [t.name for t in theirs.tensors]
    for t in theirs.tensors:
        info = ours.tensors[t.name]
        assert (info.type, info.shape, info.offset, info.nbytes) == (
            t.tensor_type, tuple(reversed(t.shape.tolist())), t.data_offset, t.n_bytes)
        assert ours.raw(t.name).tobytes() == t.data.tobytes()
    assert dict((n, s) for n, _, s in TENSORS) == {n: i.shape for n, i in ours.tensors.items()}


# -- bad files: each a ModelLoadError of one line ------------------------------------------------


@pytest.fixture(scope="module")
def good_file(tiny_models, tmp_path_factory):
    """A valid Q8_0 qwen2 file with its tokenizer."""
    path = tmp_path_factory.mktemp("gguf_good") / "model.gguf"
    return write_gguf(tiny_models.hf(MODEL, "f32"), tiny_models.path(MODEL), path, Q.Q8_0)


def load_error(path, match: str) -> str:
    with pytest.raises(ModelLoadError, match=match) as e:
        llaisys_models.load(path, device="cpu")
    message = str(e.value)
    assert "\n" not in message and str(path.name) in message
    return message


def test_the_good_file_loads(good_file):
    model = llaisys_models.load(good_file, device="cpu")
    assert type(model).__name__ == "Qwen2" and model.config.num_hidden_layers == 2


def bytes_of(path) -> bytearray:
    return bytearray(path.read_bytes())


def test_bad_magic(tmp_path, good_file):
    data = bytes_of(good_file)
    data[:4] = b"GGML"
    (bad := tmp_path / "bad.gguf").write_bytes(data)
    load_error(bad, "not a GGUF file: it starts with b'GGML'")
    (short := tmp_path / "short.gguf").write_bytes(b"GGU")
    load_error(short, "not a GGUF file: it holds only 3 bytes")


@pytest.mark.parametrize("version,match", [(1, "GGUF version 1; llaisys reads versions 2 and 3"),
                                           (4, "GGUF version 4"), (3 << 24, "big-endian")])
def test_bad_version(tmp_path, good_file, version, match):
    data = bytes_of(good_file)
    data[4:8] = version.to_bytes(4, "little")
    (bad := tmp_path / "bad.gguf").write_bytes(data)
    load_error(bad, match)


@pytest.mark.parametrize("where", ["counts", "metadata", "tensor table", "data"])
def test_truncated(tmp_path, good_file, where):
    data = bytes_of(good_file)
    header = gguf.GGUFReader(good_file)
    cut = {"counts": 12, "metadata": header.fields["tokenizer.ggml.tokens"].offset + 40,
           "tensor table": header.tensors[1].field.offset + 5, "data": len(data) - 100}[where]
    (bad := tmp_path / "cut.gguf").write_bytes(data[:cut])
    message = load_error(bad, "truncated")
    if where == "data":
        last = header.tensors[-1].name
        assert f"tensor {last!r}" in message and f"the file ends at {cut}" in message


def test_unknown_type_id(tmp_path, good_file):
    header = gguf.GGUFReader(good_file)
    t = header.tensors[3]
    type_at = t.field.offset + sum(int(p.nbytes) for p in t.field.parts[:4])  # after name and dims
    data = bytes_of(good_file)
    assert int.from_bytes(data[type_at:type_at + 4], "little") == t.tensor_type
    data[type_at:type_at + 4] = (250).to_bytes(4, "little")
    (bad := tmp_path / "bad.gguf").write_bytes(data)
    load_error(bad, f"tensor '{t.name}' has ggml type id 250")


def test_unsupported_quant_type_names_it_and_the_tensor(tiny_models, tmp_path):
    path = write_gguf(tiny_models.hf(MODEL, "f32"), tiny_models.path(MODEL), tmp_path / "iq.gguf", Q.Q8_0,
                      types={"blk.1.ffn_up.weight": Q.IQ4_NL})
    load_error(path, "tensor 'blk.1.ffn_up.weight' is stored as IQ4_NL, which llaisys cannot dequantize "
                     r"\(supported: F32, F16, BF16, Q8_0")


def test_unsupported_architecture(tiny_models, tmp_path):
    path = write_gguf(tiny_models.hf(MODEL, "f32"), tiny_models.path(MODEL), tmp_path / "g.gguf", Q.F32,
                      arch="gemma")
    # (the registry's GGUF names, sorted: gemma3, llama, olmo2, phi3, qwen2, qwen3, qwen3moe)
    load_error(path, f"GGUF architecture 'gemma' is not supported; llaisys runs {', '.join(GGUF_ARCHITECTURES)}$")


def test_missing_tensor(tiny_models, tmp_path):
    path = write_gguf(tiny_models.hf(MODEL, "f32"), tiny_models.path(MODEL), tmp_path / "m.gguf", Q.F32,
                      skip=("blk.1.ffn_down.weight",))
    load_error(path, "tensor 'blk.1.ffn_down.weight' is missing")


@pytest.mark.parametrize("extra,match", [
    ({"qwen2.rope.scaling.type": "yarn", "qwen2.rope.scaling.factor": 4.0},
     "'rope_scaling.original_max_position_embeddings' is missing"),
    ({"qwen2.rope.scaling.type": "ntk", "qwen2.rope.scaling.factor": 4.0},
     r"rope scaling of type 'ntk' \(qwen2.rope.scaling.type\) is not supported"),
    ({"qwen2.rope.dimension_count": 16}, "rope covers 16 of 32 head dimensions"),
])
def test_unsupported_rope(tiny_models, tmp_path, extra, match):
    path = write_gguf(tiny_models.hf(MODEL, "f32"), tiny_models.path(MODEL), tmp_path / "r.gguf", Q.F32,
                      extra=extra)
    load_error(path, match)


def test_missing_tokenizer(tiny_models, tmp_path):
    path = write_gguf(tiny_models.hf(MODEL, "f32"), None, tmp_path / "t.gguf", Q.F32, tokenizer=False)
    llaisys_models.load(path, device="cpu")  # the model needs no tokenizer: token ids in, token ids out
    from llaisys_models.text.tokenizer import load_tokenizer

    with pytest.raises(ModelLoadError, match="has no tokenizer in its metadata") as e:
        load_tokenizer(path)
    assert "\n" not in str(e.value)


def test_not_a_file(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        llaisys_models.load(tmp_path / "absent.gguf")
    (d := tmp_path / "dir.gguf").mkdir()
    with pytest.raises(ModelLoadError, match="is a directory, not a GGUF file"):
        llaisys_models.load(d)


def test_renamed_file_is_recognised_by_its_magic(tmp_path, good_file):
    renamed = tmp_path / "model.bin"
    shutil.copy(good_file, renamed)
    assert type(llaisys_models.load(renamed, device="cpu")).__name__ == "Qwen2"


# -- declared sizes, offsets, alignment, nesting and types: each bounded, each refused in one line ---------


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    """A valid random qwen2 file (gguf package only, no transformers), with an int and a string array to patch."""
    path = tmp_path_factory.mktemp("gguf_tiny") / "tiny.gguf"
    return write_tiny_gguf(path, extra={"t.ints": ([1, 2, 3], V.ARRAY, V.INT32), "t.strs": (["a", "b"], V.ARRAY, V.STRING)})


def u32(value: int) -> bytes:
    return struct.pack("<I", value)


def u64(value: int) -> bytes:
    return struct.pack("<Q", value)


def test_the_tiny_file_loads(tiny_file):
    model = llaisys_models.load(tiny_file, device="cpu")
    assert model.config.num_hidden_layers == 2 and len(model.generate([1, 2, 3], 2)) == 5


@pytest.mark.parametrize("value,match", [
    ((513, V.UINT32), r"qwen2.block_count must be an integer in \[1, 512\], got 513"),
    ((0, V.UINT32), r"qwen2.block_count must be an integer in \[1, 512\], got 0"),
    ((3, V.UINT32), r"the metadata says 3 layers \(block_count\), but the file holds tensors of layers 0..1 "
                    r"\(2 layers; layer 2 is missing\)"),
])
def test_layer_count(tmp_path, value, match):
    """Past llama.cpp's 512 layers, or past the layers the file holds tensors for: refused before any
    per-layer plan is built."""
    path = write_tiny_gguf(tmp_path / "layers.gguf", extra={"qwen2.block_count": value})
    load_error(path, match)


@pytest.mark.parametrize("key", ["embedding_length", "feed_forward_length", "attention.head_count",
                                 "attention.head_count_kv", "attention.key_length", "context_length", "vocab_size"])
@pytest.mark.parametrize("value,shown", [((2 ** 32, V.UINT64), "4294967296"), ((-1, V.INT32), "-1"),
                                         ((True, V.BOOL), "True"), (("8", V.STRING), "'8'"), ((1.5, V.FLOAT32), "1.5")])
def test_sizes_are_bounded(tmp_path, key, value, shown):
    """Every size hyper-parameter is an integer in [1, 2**32 - 1] (llama.cpp keeps them in uint32_t)."""
    path = write_tiny_gguf(tmp_path / "size.gguf", extra={f"qwen2.{key}": value})
    load_error(path, rf"metadata key qwen2.{key} must be an integer in \[1, 4294967295\], got {shown}$")


@pytest.mark.parametrize("tensor", ["token_embd.weight", "blk.0.attn_q.weight", "blk.1.ffn_down.weight"])
@pytest.mark.parametrize("shift", [4, 16, 1])
def test_misaligned_tensor_offset(tmp_path, tiny_file, tensor, shift):
    """An offset that is not a multiple of general.alignment is refused (it used to load the shifted bytes)."""
    at = tensor_at(tiny_file, tensor, "offset")
    (offset,) = struct.unpack_from("<Q", tiny_file.read_bytes(), at)
    path = patched(tiny_file, tmp_path / "shifted.gguf", at, u64(offset + shift))
    load_error(path, rf"tensor '{tensor}' is at offset {offset + shift} of the data section, which is not a multiple "
                     r"of general.alignment \(32\)")


@pytest.mark.parametrize("offset", [2 ** 20, 2 ** 63])
def test_tensor_outside_the_data_section(tmp_path, tiny_file, offset):
    path = patched(tiny_file, tmp_path / "far.gguf", tensor_at(tiny_file, "output_norm.weight", "offset"), u64(offset))
    load_error(path, r"truncated or corrupt: tensor 'output_norm.weight' lies at bytes \[\d+, \d+\) but the file ends")


@pytest.mark.parametrize("value,shown", [((4, V.UINT32), "4"), ((3, V.UINT32), "3"), ((0, V.UINT32), "0"),
                                         ((48, V.UINT32), "48"), ((32, V.UINT64), "a UINT64"),
                                         (("32", V.STRING), "a STRING")])
def test_bad_alignment(tmp_path, value, shown):
    """general.alignment: a UINT32 power of two and a multiple of 8 (llama.cpp and the GGUF specification)."""
    path = write_tiny_gguf(tmp_path / "align.gguf", extra={"general.alignment": value})
    load_error(path, f"general.alignment must be a UINT32 power of two of at least 8, got {shown}$")


def test_alignment_past_the_end_of_the_file(tmp_path):
    path = write_tiny_gguf(tmp_path / "align.gguf", extra={"general.alignment": (2 ** 31, V.UINT32)})
    load_error(path, f"the data section would start at byte {2 ** 31}, past the end of the file")


@pytest.mark.parametrize("alignment", [8, 4096])
def test_any_sane_alignment_loads(tmp_path, alignment):
    model = llaisys_models.load(write_tiny_gguf(tmp_path / "a.gguf", alignment=alignment), device="cpu")
    assert model.config.num_hidden_layers == 2


def nested(depth: int) -> bytes:
    """An ARRAY value ``depth`` arrays deep, the innermost holding one UINT8 (7)."""
    return (u32(V.ARRAY) + u64(1)) * (depth - 1) + u32(V.UINT8) + u64(1) + bytes([7])


def test_nested_arrays(tmp_path, tiny_file):
    """Arrays in arrays, up to 8 deep; deeper is refused in one line (3000 deep used to be a RecursionError)."""
    path = with_records(tiny_file, tmp_path / "nested.gguf", [kv_record("t.deep", V.ARRAY, nested(8))])
    value = GGUFFile(path).metadata["t.deep"]
    for _ in range(8):
        assert isinstance(value, list) and len(value) == 1
        value = value[0]
    assert value == 7
    for depth in (9, 3000):
        path = with_records(tiny_file, tmp_path / "deep.gguf", [kv_record("t.deep", V.ARRAY, nested(depth))])
        load_error(path, r"metadata key 't.deep': arrays are nested more than 8 deep \(at byte \d+\)$")


TOKENIZER = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": (["a", "b", "c"], V.ARRAY, V.STRING)}


@pytest.mark.parametrize("key,value,match", [
    ("tokenizer.ggml.tokens", ([1, 2, 3], V.ARRAY, V.INT32), "must be an array of strings, but item 0 is 1$"),
    ("tokenizer.ggml.tokens", (7, V.UINT32), "must be an array of strings, got 7$"),
    ("tokenizer.ggml.tokens", ("abc", V.STRING), "must be an array of strings, got 'abc'$"),
    ("tokenizer.ggml.merges", ([1, 2], V.ARRAY, V.INT32), "must be an array of strings, but item 0 is 1$"),
    ("tokenizer.ggml.token_type", (["1", "1", "1"], V.ARRAY, V.STRING), "must be an array of integers, but item 0"),
    ("tokenizer.ggml.token_type", ([1, 1], V.ARRAY, V.INT32), "has 2 entries for 3 tokens$"),
    ("tokenizer.ggml.scores", ([0.0], V.ARRAY, V.FLOAT32), "has 1 entries for 3 tokens$"),
    ("tokenizer.ggml.model", (2, V.UINT32), "must be a string, got 2$"),
    ("tokenizer.chat_template", (2, V.UINT32), "must be a string, got 2$"),
    ("tokenizer.ggml.bos_token_id", ("1", V.STRING), "must be a token id, got '1'$"),
    ("tokenizer.ggml.add_bos_token", (1, V.UINT32), "must be true or false, got 1$"),
])
def test_tokenizer_metadata_of_the_wrong_type(tmp_path, key, value, match):
    """A tokenizer key of the wrong type (a scalar used to raise TypeError) or length: one line naming the key."""
    path = write_tiny_gguf(tmp_path / "tok.gguf", extra={**TOKENIZER, key: value})
    with pytest.raises(ModelLoadError, match=match) as e:
        llaisys_models.load_tokenizer(path)
    message = str(e.value)
    assert "\n" not in message and str(path) in message and f"metadata key {key} " in message


ARCH, EMBD = "general.architecture", "token_embd.weight"
HEADER_CASES = {  # what: (where in the file, the bytes written there, the message)
    "tensor count": (lambda p: 8, u64(2 ** 62), r"the header declares 4611686018427387904 tensors and \d+ metadata "
                                                r"keys, more than the \d+ bytes after it can hold"),
    "key count": (lambda p: 16, u64(2 ** 40), r"declares \d+ tensors and 1099511627776 metadata keys, more than"),
    "key length": (lambda p: 24, u64(2 ** 40), r"metadata key 0 at byte 24 declares 1099511627776 bytes "
                                               r"\(at most 1073741824 allowed\)$"),
    "key length past the end": (lambda p: 24, u64(2 ** 29), "truncated or corrupt: .*runs past the end of the file"),
    "empty key": (lambda p: 24, u64(0), "metadata key 0 is empty$"),
    "key not UTF-8": (lambda p: 32, b"\xff", "metadata key 0 at byte 24 is not valid UTF-8"),
    "value type": (lambda p: metadata_at(p, ARCH, 2), u32(99),
                   r"metadata key 'general.architecture': unknown metadata value type 99 at byte \d+"),
    "string length": (lambda p: metadata_at(p, ARCH, 3), u64(2 ** 31),
                      r"metadata key 'general.architecture': a string at byte \d+ declares 2147483648 bytes"),
    "string not UTF-8": (lambda p: metadata_at(p, ARCH, 4), b"\xc3\x28",
                         r"metadata key 'general.architecture': a string at byte \d+ is not valid UTF-8"),
    "array item type": (lambda p: metadata_at(p, "t.ints", 3), u32(77),
                        "metadata key 't.ints': unknown metadata value type 77"),
    "array count": (lambda p: metadata_at(p, "t.ints", 4), u64(2 ** 31),
                    r"metadata key 't.ints': an array at byte \d+ declares 2147483648 items \(at most 1073741824"),
    "array count past the end": (lambda p: metadata_at(p, "t.ints", 4), u64(2 ** 29),
                                 r"truncated or corrupt: metadata key 't.ints': an array of 536870912 INT32 items "
                                 r"at byte \d+ cannot fit"),
    "string array count": (lambda p: metadata_at(p, "t.strs", 4), u64(2 ** 29),
                           "metadata key 't.strs': an array of 536870912 STRING items"),
    "tensor name length": (lambda p: tensor_at(p, EMBD, "name length"), u64(64),
                           r"the name of tensor 0 at byte \d+ declares 64 bytes \(at most 63 allowed\)$"),
    "tensor dimensions": (lambda p: tensor_at(p, EMBD, "dimensions"), u64(2 ** 62) * 2,
                          r"tensor 'token_embd.weight' has shape \(4611686018427387904, 4611686018427387904\): more "
                          r"than 9223372036854775807 elements$"),
    "tensor dimension count": (lambda p: tensor_at(p, EMBD, "dimension count"), u32(5),
                               r"tensor 'token_embd.weight' has 5 dimensions \(1..4 allowed\)$"),
    "tensor type": (lambda p: tensor_at(p, EMBD, "type"), u32(2 ** 31), "has ggml type id 2147483648"),
}


@pytest.mark.parametrize("what", list(HEADER_CASES))
def test_corrupt_header_field(tmp_path, tiny_file, what):
    """Each corrupt header field: a ModelLoadError of one line naming the file and the field (the key)."""
    where, value, match = HEADER_CASES[what]
    load_error(patched(tiny_file, tmp_path / "corrupt.gguf", where(tiny_file), value), match)


def test_every_truncation_is_one_line(tmp_path, tiny_file):
    """The file cut at every byte of its header (and a little past): always a ModelLoadError of one line."""
    data = tiny_file.read_bytes()
    header_end = GGUFFile(tiny_file).tensors["token_embd.weight"].offset
    path = tmp_path / "cut.gguf"
    for cut in range(header_end + 40):
        path.write_bytes(data[:cut])
        with pytest.raises(ModelLoadError) as e:
            GGUFFile(path)
        assert "\n" not in str(e.value) and str(path) in str(e.value), cut


def test_tensor_name_length(tmp_path):
    """Tensor names are shorter than ggml's 64 bytes; a longer one is refused, a 63-byte one read."""
    for length, ok in ((63, True), (64, False)):
        writer = gguf.GGUFWriter(tmp_path / "name.gguf", "test")
        writer.add_tensor("x" * length, np.zeros(8, np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        if ok:
            assert list(GGUFFile(tmp_path / "name.gguf").tensors) == ["x" * 63]
        else:
            with pytest.raises(ModelLoadError, match=r"the name of tensor 0 at byte \d+ declares 64 bytes"):
                GGUFFile(tmp_path / "name.gguf")
