#!/usr/bin/env python
"""GGUF load benchmark: load time, dequantization throughput, peak RSS and decode speed after load.

    python benchmarks/make_model.py --out /tmp/qwen2-1.5b        # the 1.5B shape, random bf16
    python benchmarks/gguf_load.py --model /tmp/qwen2-1.5b --out /tmp/gguf-bench

Writes the checkpoint as GGUF files with the ``gguf`` package (Q8_0 quantized by its own
quantizer; the package has no k-quant quantizer, so Q4_K blocks are random bytes with f16
scales set to the tensors' spread: decoding does the same work whatever the bytes), then, each
in its own process so that peak RSS is its own:

- loads every GGUF file and the bf16 safetensors directory (the reference row) into bf16;
- times load + first token (where the lazily mapped safetensors checkpoint pays its page-ins);
- times llaisys' block decoders alone (GB/s of bf16 written) over the whole load, and against
  the gguf package's reference dequantizer (numpy, float32) on the same tensors of four layers;
- checks peak RSS against the decoded weights plus the largest single tensor (the bound a load is held to);
- decodes 32 tokens after a 16-token prompt (greedy, EOS ignored).

The GGUF files are deleted afterwards unless --keep is given.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

PROMPT_SEED = 1234
GIB = 1 << 30
ROW_CHUNK = 1 << 22  # values converted per step while writing, so writing stays within a few hundred MB


def status_bytes(field: str) -> int:
    """VmRSS (now) or VmHWM (peak) of this process, from /proc/self/status.

    Not getrusage's ru_maxrss: Linux carries a parent's RSS at fork time into its child's
    ru_maxrss, so a worker started by a parent that had just written 2 GB would report that.
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def prompt(length: int, vocab: int) -> list[int]:
    return np.random.default_rng(PROMPT_SEED + length).integers(0, vocab, size=length).tolist()


# -- writing the GGUF files ---------------------------------------------------------------

HF_FIELDS = {"input_layernorm.weight": "input_norm", "post_attention_layernorm.weight": "mlp_norm",
             "self_attn.q_proj.weight": "q_proj", "self_attn.k_proj.weight": "k_proj",
             "self_attn.v_proj.weight": "v_proj", "self_attn.o_proj.weight": "o_proj",
             "self_attn.q_proj.bias": "q_bias", "self_attn.k_proj.bias": "k_bias", "self_attn.v_proj.bias": "v_bias",
             "mlp.gate_proj.weight": "gate_proj", "mlp.up_proj.weight": "up_proj", "mlp.down_proj.weight": "down_proj"}


def gguf_name(hf_name: str) -> str:
    """model.layers.3.mlp.up_proj.weight -> blk.3.ffn_up.weight (llaisys' own name table)."""
    from llaisys_models.families.family import GGUF_TOP as TOP_NAMES
    from llaisys_models.families.family import LLAMA_CPP_TENSORS as LAYER_NAMES

    top = {"model.embed_tokens.weight": "embed_tokens", "model.norm.weight": "norm", "lm_head.weight": "lm_head"}
    if hf_name in top:
        return TOP_NAMES[top[hf_name]]
    _, _, i, rest = hf_name.split(".", 3)
    return f"blk.{i}.{LAYER_NAMES[HF_FIELDS[rest]]}"


def encode(values: np.ndarray, qtype, rng) -> np.ndarray:
    """float32 rows -> stored bytes of ``qtype`` (Q8_0 by gguf's quantizer; Q4_K random, scaled)."""
    import gguf

    Q = gguf.GGMLQuantizationType
    if qtype != Q.Q4_K:
        return gguf.quants.quantize(values, qtype).view(np.uint8)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(values.size // block, size), dtype=np.uint8)
    # values ~ d * scale * q - dmin * min with 6-bit scales/mins and 4-bit q: std about 330 d
    d = np.float16(values.std() / 330)
    blocks[:, 0:2] = np.full((len(blocks), 1), d, np.float16).view(np.uint8)
    blocks[:, 2:4] = np.full((len(blocks), 1), d * np.float16(7.5), np.float16).view(np.uint8)
    return blocks.reshape(values.shape[0], -1)


def write_gguf(model_dir: Path, path: Path, type_name: str, placeholder_vocab: bool = False) -> None:
    """The checkpoint as a GGUF file of ``type_name``. Without a vocabulary (tokenizer "none": llama-quantize and
    llama-bench use dummy tokens), or with ``placeholder_vocab`` a byte-level BPE one of tokens "t0", "t1", ...
    and one merge, for llama-server, which turns each new token into text (a file without one aborts there)."""
    import gguf

    from llaisys_models.loading.loader import config_file
    from llaisys_models.loading.safetensors import Checkpoint

    qtype = gguf.GGMLQuantizationType[type_name]
    c = config_file(model_dir)
    ckpt = Checkpoint(model_dir)
    writer = gguf.GGUFWriter(path, "qwen2")
    writer.add_name(f"{model_dir.name} ({type_name})")
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    writer.add_eos_token_id(c.eos_token_ids[0])
    if placeholder_vocab:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list([f"t{i}" for i in range(c.vocab_size)])
        writer.add_token_types([gguf.TokenType.NORMAL] * c.vocab_size)
        writer.add_token_merges(["t 0"])
        writer.add_bos_token_id(c.eos_token_ids[0])
        writer.add_add_bos_token(False)
    else:
        writer.add_tokenizer_model("none")

    names = list(ckpt.infos)
    types = {name: qtype if len(ckpt.infos[name].shape) == 2 else gguf.GGMLQuantizationType.F32 for name in names}
    for name in names:
        shape = ckpt.infos[name].shape
        block, size = gguf.GGML_QUANT_SIZES[types[name]]
        nbytes = int(np.prod(shape)) // block * size
        writer.add_tensor_info(gguf_name(name), shape, np.dtype(np.float32), nbytes, raw_dtype=types[name])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for i, name in enumerate(names):
        tensor = ckpt.tensor(name).numpy().astype(np.float32) if len(ckpt.infos[name].shape) == 1 else None
        if tensor is None:  # a matrix: converted a few rows at a time
            source = ckpt.tensor(name).numpy()
            step = max(1, ROW_CHUNK // source.shape[1])
            tensor = np.concatenate([encode(source[s:s + step].astype(np.float32), types[name], rng)
                                     for s in range(0, source.shape[0], step)])
        writer.write_tensor_data(tensor)
        if i % 16 == 15 or i == len(names) - 1:
            print(f"\rwriting {path.name}: {i + 1}/{len(names)} tensors ({time.perf_counter() - t0:.0f}s)",
                  end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    writer.close()


# -- workers (each in its own process) ----------------------------------------------------

def work_load(path: Path, decode_tokens: int) -> dict:
    import llaisys_models
    from llaisys_models.loading.gguf import quants, reader  # noqa: F401  (imports gguf: not part of the weights' memory)

    decode_time = [0.0]
    decoded_bytes = [0]
    dequantize = quants.dequantize

    def timed(raw, qtype, out, rows=None):
        t0 = time.perf_counter()
        result = dequantize(raw, qtype, out, rows)
        decode_time[0] += time.perf_counter() - t0
        decoded_bytes[0] += out.nbytes
        return result

    quants.dequantize = timed
    baseline = status_bytes("VmRSS")
    t0 = time.perf_counter()
    model = llaisys_models.load(path, device="cpu", dtype="bfloat16", progress=False)
    load = time.perf_counter() - t0
    load_peak = status_bytes("VmHWM")
    tensors = [model.weights.embed_tokens, model.weights.norm, model.weights.lm_head]
    tensors += [t for layer in model.weights.layers for t in vars(layer).values() if t is not None]
    unique = {id(t): t.nbytes for t in tensors}
    vocab = model.config.vocab_size
    model.generate(prompt(16, vocab), 1, eos_token_ids=())  # a mapped checkpoint pays its page-ins here
    first_token = time.perf_counter() - t0
    model.generate(prompt(16, vocab), 2, eos_token_ids=())  # warm-up
    model.generate(prompt(16, vocab), decode_tokens, eos_token_ids=())
    return {"load_s": load, "first_token_s": first_token, "decode_s": decode_time[0], "decoded_bytes": decoded_bytes[0],
            "weights": sum(unique.values()), "largest": max(unique.values()), "baseline_rss": baseline,
            "load_peak_rss": load_peak, "decode_tok_s": model.last_stats.decode_tokens_per_second}


def work_reference(path: Path, layers: int) -> dict:
    """llaisys' decoders vs gguf's reference dequantizer on the matrices of the first layers."""
    import gguf
    import ml_dtypes

    from llaisys_models.loading.gguf import quants
    from llaisys_models.loading.gguf.reader import GGUFFile

    f = GGUFFile(path)
    names = [n for n, i in f.tensors.items() if len(i.shape) == 2 and n.startswith(tuple(f"blk.{k}." for k in
                                                                                         range(layers)))]
    ours = theirs = 0.0
    values = 0
    for name in names:
        info = f.tensors[name]
        raw = f.raw(name)
        out = np.empty(info.shape, ml_dtypes.bfloat16)
        t0 = time.perf_counter()
        quants.dequantize(raw, info.type, out)
        ours += time.perf_counter() - t0
        t0 = time.perf_counter()
        gguf.quants.dequantize(raw, info.type)
        theirs += time.perf_counter() - t0
        values += out.size
    return {"values": values, "ours_s": ours, "gguf_s": theirs}


def run_worker(*args) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", *map(str, args)], check=True, stdout=subprocess.PIPE,
                         text=True)  # stderr (the writer's progress) passes through
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="HF directory of the model to convert (benchmarks/make_model.py)")
    ap.add_argument("--out", type=Path, help="where the GGUF files go")
    ap.add_argument("--types", nargs="+", default=["Q8_0", "Q4_K"])
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--reference-layers", type=int, default=4)
    ap.add_argument("--keep", action="store_true", help="keep the GGUF files")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        kind, path, arg = args.worker
        if kind == "write":  # in its own process too, so that this one stays small
            write_gguf(Path(arg), Path(path), Path(path).stem.rsplit("-", 1)[1])
            result = {}
        else:
            result = work_load(Path(path), int(arg)) if kind == "load" else work_reference(Path(path), int(arg))
        print(json.dumps(result))
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    rows = {"bf16 safetensors": run_worker("load", args.model, args.decode_tokens)}
    files = []
    for type_name in args.types:
        path = args.out / f"{args.model.name}-{type_name}.gguf"
        files.append(path)
        if not path.exists():
            run_worker("write", path, args.model)
        size = path.stat().st_size
        row = run_worker("load", path, args.decode_tokens)
        row["file_bytes"] = size
        row["reference"] = run_worker("reference", path, args.reference_layers)
        rows[f"GGUF {type_name}"] = row

    print(f"\n{args.model} -> bf16 weights, {os.cpu_count()} CPUs\n")
    print(f"{'':18} {'file GiB':>8} {'load s':>7} {'+1st tok s':>10} {'dequant GB/s':>12} {'ref ratio':>9} "
          f"{'peak-base GiB':>13} {'bound GiB':>9} {'tok/s':>6}")
    for label, r in rows.items():
        grow = (r["load_peak_rss"] - r["baseline_rss"]) / GIB
        bound = (r["weights"] + r["largest"]) / GIB
        if "reference" in r:
            ref = r["reference"]
            throughput = r["decoded_bytes"] / r["decode_s"] / 1e9
            ratio = f"{ref['gguf_s'] / ref['ours_s']:.1f}x"
            file_gib = f"{r['file_bytes'] / GIB:.2f}"
        else:
            throughput, ratio, file_gib = float("nan"), "", ""
        print(f"{label:18} {file_gib:>8} {r['load_s']:7.2f} {r['first_token_s']:10.2f} {throughput:12.2f} {ratio:>9} "
              f"{grow:13.2f} {bound:9.2f} {r['decode_tok_s']:6.1f}")
    base = rows["bf16 safetensors"]
    print("\n+1st tok: load, then a 16-token prompt to its first new token (a mapped checkpoint pages in here);")
    print("dequant GB/s: bf16 bytes written by llaisys' block decoders per second spent in them (one core);")
    print(f"ref ratio: gguf.quants.dequantize time / llaisys' on the matrices of {args.reference_layers} layers;")
    print("peak-base: peak RSS during the load minus RSS before it; bound: the decoded weights + the largest tensor.")
    for label, r in rows.items():
        if label != "bf16 safetensors":
            print(f"{label}: load + first token {r['first_token_s'] / base['first_token_s']:.2f}x the safetensors "
                  f"one, decode "
                  f"{r['decode_tok_s'] / base['decode_tok_s']:.2f}x its tok/s; peak within bound: "
                  f"{r['load_peak_rss'] - r['baseline_rss'] <= r['weights'] + r['largest']}")
    if not args.keep:
        for path in files:
            path.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
