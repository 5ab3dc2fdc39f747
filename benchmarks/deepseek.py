#!/usr/bin/env python
"""DeepSeek-V2-Lite-shaped decode (latent attention + DeepSeekMoE) against its active-parameter bound and llama.cpp.

    python benchmarks/deepseek.py --dir /tmp/deepseek-bench [--layers 4] [--prompt 64] [--new 64] [--threads 2]
                                  [--rounds 3] [--llama-bench PATH] [--convert PATH] [--quick]

Writes (once, in --dir) a random bf16 checkpoint with transformers: DeepseekV2Config in DeepSeek-V2-Lite's shape
(hidden 2048, 16 heads, kv_lora_rank 512 and no q_lora_rank, qk_nope 128 + qk_rope 64, v_head_dim 128; 64 routed
experts of width 1408, top 6 by softmax, greedy, weights not renormalised, 2 shared experts; layer 0 dense of width
10944; vocab 102400, untied lm_head) with only --layers layers (4: 2.25 B parameters, 4.5 GB; the real model has
27). Rope is the default one (V2-Lite's YaRN changes no byte read). The model is made in bf16 (no float32 copy of
it is ever made) and written by save_pretrained, with a byte-level tokenizer. With --llama-bench, the directory
is also converted to a bf16 GGUF by llama.cpp's convert_hf_to_gguf.py (--convert; default: the llama-cpp-python
sdist's vendored tree under /work/llama), arch deepseek2, which llama.cpp runs with MLA too. (The converter
recognises a tokenizer by hashing its output; it does not know this test tokenizer, so it runs with
get_vocab_base_pre answering "gpt-2": llama-bench runs on token ids and never tokenizes; and it writes
attention.q_lora_rank = 0, which llama.cpp requires of a deepseek2 file without a q low rank unless it has
V2-Lite's 26 or 27 layers.)

Each round, llaisys runs in its own process (its peak RSS its own): it loads the directory, warms up, then three
times prefills a new --prompt-token prompt (random ids) and decodes --new tokens greedily (EOS ignored), the
machine's memory rate measured around each decode two ways: llaisys_models.bench.bandwidth.copy_bandwidth (a
256 MiB copy, read + written bytes: what ``llaisys bench`` divides by; before and after, the higher reading) and
the read rate of a dense bf16 ``linear`` over a 1 GiB weight at M = 1 (benchmarks/moe.py's bound: a decode step
only reads); medians of the three. Then llama-bench on the GGUF, right after: ``-p PROMPT -n 0`` (prefill) and
``-p 0 -n NEW -d DEPTH`` (decode; --llama-depth, default the prompt's length: after a context as long as the one
llaisys decodes after; 0 gives llama-bench's plain tgNEW), ``-t THREADS -r 3``. Printed:

  * the active bytes a decode token must read, bf16: every layer's attention (q_proj, kv_a_proj_with_mqa, kv_b_proj
    as the absorbed W_uk / W_uv, o_proj), the dense layer's MLP, each sparse layer's router, 6 of 64 routed
    experts and the 2 shared ones, the norms, the lm_head and one embedding row, plus the latent KV cache read
    at the decode's mean context length; computed from the config, and checked against
    llaisys_models.bench.bandwidth.decode_bytes on the loaded model;
  * decode tok/s of llaisys and llama.cpp, each against both bounds (rate / active bytes), and llaisys /
    llama.cpp per round (median over --rounds, and each round's); prefill tok/s and its ratios likewise;
  * the KV cache's bytes per token from the llaisys pool (model.new_kv_pool(...).bytes_per_block / block_size)
    against caches of the same layers and 16 heads without the latent: MHA over 16 KV heads of head_dim 128 (the
    "GQA model of the same size": layers x 2 x 16 x 128 values), HF's expanded MLA cache (keys of 128 + 64, values
    of 128 per head), and a GQA cache of 4 KV heads of 128.

--quick: a small shape (hidden 256, 8 heads, latent 64, 16 experts top 6, vocab 4096), 2 layers, 8 new tokens, one
round: a check that the script runs end to end, in seconds.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_load import status_bytes  # noqa: E402

# DeepSeek-V2-Lite (deepseek-ai/DeepSeek-V2-Lite's config.json), but for the layer count
SHAPE = dict(hidden=2048, heads=16, kv_lora_rank=512, q_lora_rank=None, qk_nope=128, qk_rope=64, v_head=128,
             experts=64, top_k=6, shared=2, moe_inter=1408, dense_layers=1, inter=10944, vocab=102400)
QUICK_SHAPE = dict(SHAPE, hidden=256, heads=8, kv_lora_rank=64, qk_nope=32, qk_rope=16, v_head=32, experts=16,
                   moe_inter=128, inter=512, vocab=4096)
EOS_ID = 256  # the byte-level tokenizer's <|endoftext|>
PROMPT_SEED = 1234
CONVERTERS = "/work/llama/llama_cpp_python-*/vendor/llama.cpp/convert_hf_to_gguf.py"


def shape_of(args) -> dict:
    return QUICK_SHAPE if args.quick else SHAPE


def checkpoint_dir(args) -> Path:
    return args.dir / f"deepseek-v2-lite-{'quick-' if args.quick else ''}{args.layers}l-bf16"


def prompt(length: int, vocab: int, variant: int) -> list[int]:
    """Random token ids, another prompt per ``variant`` (llaisys reuses a cached prompt prefix: a prompt run twice
    would prefill one token the second time)."""
    return np.random.default_rng(PROMPT_SEED + 7919 * variant).integers(0, vocab, size=length).tolist()


def write_tokenizer(directory: Path) -> None:
    """A byte-level tokenizer (byte b is token b, <|endoftext|> 256), as tests/helpers/tiny_models.py writes, with
    one merge (two NUL bytes, token 257): llama.cpp refuses a BPE vocabulary without merges."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = bytes_to_unicode()
    vocab = {sym: b for b, sym in alphabet.items()} | {"<|endoftext|>": EOS_ID, alphabet[0] * 2: EOS_ID + 1}
    core = Tokenizer(BPE(vocab=vocab, merges=[(alphabet[0], alphabet[0])], unk_token=None, fuse_unk=False,
                         byte_fallback=False))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>",
                            pad_token="<|endoftext|>").save_pretrained(directory)


def write_checkpoint(directory: Path, layers: int, s: dict) -> None:
    """The random checkpoint, made in bf16 (the parameters are created in bf16 and drawn in place: no float32 copy),
    written by save_pretrained in shards of 1 GB, the routers cast to bf16 too (HF keeps them f32 in memory; the
    released checkpoints store them bf16)."""
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    config = DeepseekV2Config(
        vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["inter"],
        moe_intermediate_size=s["moe_inter"], num_hidden_layers=layers, num_attention_heads=s["heads"],
        num_key_value_heads=s["heads"], n_shared_experts=s["shared"], n_routed_experts=s["experts"],
        num_experts_per_tok=s["top_k"], routed_scaling_factor=1.0, kv_lora_rank=s["kv_lora_rank"],
        q_lora_rank=s["q_lora_rank"], qk_nope_head_dim=s["qk_nope"], qk_rope_head_dim=s["qk_rope"],
        v_head_dim=s["v_head"], topk_method="greedy", n_group=1, topk_group=1, norm_topk_prob=False,
        first_k_dense_replace=s["dense_layers"], max_position_embeddings=4096, rms_norm_eps=1e-6,
        initializer_range=0.02, tie_word_embeddings=False, rope_parameters={"rope_type": "default",
                                                                             "rope_theta": 10000.0},
        bos_token_id=None, eos_token_id=EOS_ID, pad_token_id=EOS_ID, architectures=["DeepseekV2ForCausalLM"])
    torch.manual_seed(0)
    with torch.no_grad():
        model = DeepseekV2ForCausalLM._from_config(config, dtype=torch.bfloat16).eval()
        for _, p in model.named_parameters():
            if p.dtype != torch.bfloat16:  # (the routers: _keep_in_fp32_modules_strict)
                p.data = p.data.to(torch.bfloat16)
        model.config.dtype = torch.bfloat16
        model.save_pretrained(directory, max_shard_size="1GB")
    del model
    write_tokenizer(directory)


def convert_to_gguf(directory: Path, converter: str, out: Path) -> None:
    """llama.cpp's convert_hf_to_gguf.py --outtype bf16, its get_vocab_base_pre answering "gpt-2" (the module
    docstring says why), and q_lora_rank 0 written where the config has none: llama.cpp's deepseek2 loader takes a
    file without the key for V2-Lite only by its layer count (26 or 27), and requires it otherwise (0: one q_proj)."""
    root = str(Path(converter).parent)
    code = ("import sys, runpy; sys.path.insert(0, sys.argv[1]); from conversion import base, deepseek; "
            "base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'gpt-2'; "
            "cls = deepseek.DeepseekV2Model; original = cls.set_gguf_parameters\n"
            "def set_gguf_parameters(self):\n"
            "    original(self)\n"
            "    if self.hparams.get('q_lora_rank') is None: self.gguf_writer.add_q_lora_rank(0)\n"
            "cls.set_gguf_parameters = set_gguf_parameters; "
            "sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", code, root, converter, str(directory), "--outtype", "bf16",
                             "--outfile", str(out)], capture_output=True, text=True)
    if result.returncode:
        out.unlink(missing_ok=True)
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{result.stderr[-3000:]}")


def active_bytes(layers: int, s: dict, context: float) -> dict:
    """Bytes (bf16) one decode step must read, by part, from the shape: the weights it multiplies by (a sparse
    layer's chosen experts only; the embedding: its one row) and the latent cache at ``context`` positions."""
    h, heads, dc, dr = s["hidden"], s["heads"], s["kv_lora_rank"], s["qk_rope"]
    attention = (h * heads * (s["qk_nope"] + dr)  # q_proj
                 + h * (dc + dr)  # kv_a_proj_with_mqa
                 + dc * heads * (s["qk_nope"] + s["v_head"])  # kv_b_proj (W_uk, W_uv)
                 + heads * s["v_head"] * h  # o_proj
                 + 2 * h + dc)  # input, post-attention and latent norms
    dense = 3 * h * s["inter"]
    sparse = s["experts"] * h + (s["top_k"] + s["shared"]) * 3 * h * s["moe_inter"]
    n_dense = min(s["dense_layers"], layers)
    parts = dict(attention=layers * attention, dense_mlp=n_dense * dense, moe=(layers - n_dense) * sparse,
                 lm_head=s["vocab"] * h + h + h, kv=layers * (dc + dr) * context)  # (+ final norm, embedding row)
    return {k: 2 * v for k, v in parts.items()}


def total_parameters(layers: int, s: dict) -> int:
    """Every parameter of the checkpoint (all 64 experts, the embedding table whole)."""
    h = s["hidden"]
    attention = active_bytes(1, s, 0)["attention"] // 2
    n_dense = min(s["dense_layers"], layers)
    sparse = s["experts"] * h + (s["experts"] + s["shared"]) * 3 * h * s["moe_inter"]
    return (layers * attention + n_dense * 3 * h * s["inter"] + (layers - n_dense) * sparse
            + 2 * s["vocab"] * h + h)


def run_llaisys(args) -> dict:
    """One round in this process: load, warm up, three (prefill, decode) runs each between two bandwidth readings;
    the KV pool's bytes per token; the model's own count of the bytes a decode step reads."""
    from moe import stream_rate

    import llaisys_models
    from llaisys_models.bench.bandwidth import copy_bandwidth, decode_bytes

    vocab = shape_of(args)["vocab"]
    t = time.perf_counter()
    model = llaisys_models.load(checkpoint_dir(args), device=args.device, progress=False)
    load_s, peak = time.perf_counter() - t, status_bytes("VmHWM")
    model.generate(prompt(args.prompt, vocab, 99), 4, eos_token_ids=())  # warm-up: page-ins, decode graphs
    stream = stream_rate("bf16", args.device)
    prefill, decode, bandwidth, streams = [], [], [], []
    for i in range(3):
        before = copy_bandwidth(model.device)
        model.generate(prompt(args.prompt, vocab, args.round * 3 + i), args.new, eos_token_ids=())
        bandwidth.append(max(before, copy_bandwidth(model.device)))  # (a VM's bandwidth drifts: the higher reading)
        streams.append(stream())
        prefill.append(model.last_stats.prefill_tokens_per_second)
        decode.append(model.last_stats.decode_tokens_per_second)
    pool = model.new_kv_pool(num_blocks=4, block_size=16)
    kv_per_token = pool.bytes_per_block / pool.block_size
    # decode_bytes' weights: its count for a tgN run less its KV term (1 + (N + 1) / 2 positions)
    weights = decode_bytes(model, args.new) - model.kv_shape.bytes_per_token * (1 + (args.new + 1) / 2)
    return dict(load_s=load_s, peak=peak, prefill=statistics.median(prefill), decode=statistics.median(decode),
                bandwidth=statistics.median(bandwidth), stream=statistics.median(streams), kv_per_token=kv_per_token,
                weights=weights, model=type(model).__name__)


def run_llama_bench(binary: str, path: Path, threads: int, *test: str) -> float:
    result = subprocess.run([binary, "-m", str(path), *test, "-t", str(threads), "-r", "3", "-o", "json"],
                            capture_output=True, text=True, timeout=3600)
    if result.returncode:
        raise RuntimeError(f"llama-bench failed:\n{result.stderr[-2000:]}")
    rows = json.loads(result.stdout[result.stdout.index("["):])
    return float(rows[0]["avg_ts"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/deepseek-bench"),
                        help="where the checkpoint (and the GGUF) are written once and kept")
    parser.add_argument("--layers", type=int, default=None, help="layers (default 4; --quick 2)")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    parser.add_argument("--new", type=int, default=None, help="new tokens (default 64; --quick 8)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=None, help="rounds of llaisys then llama.cpp (default 3)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--llama-depth", type=int, default=None,
                        help="llama-bench's context before its decode test (-d; default: --prompt)")
    parser.add_argument("--llama-bench", default=None, help="a llama.cpp llama-bench binary (none: the bound only)")
    parser.add_argument("--convert", default=None, help=f"llama.cpp's convert_hf_to_gguf.py (default: {CONVERTERS})")
    parser.add_argument("--quick", action="store_true", help="a small shape, 2 layers, 8 new tokens, one round")
    parser.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)  # a worker's round
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a worker process: one llaisys round
    args = parser.parse_args()
    args.layers = args.layers or (2 if args.quick else 4)
    args.new = args.new or (8 if args.quick else 64)
    args.rounds = args.rounds or (1 if args.quick else 3)
    depth = args.prompt if args.llama_depth is None else args.llama_depth
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    if args.one:
        print(json.dumps(run_llaisys(args)))
        return

    s, directory = shape_of(args), checkpoint_dir(args)
    if not (directory / "config.json").exists():
        t = time.perf_counter()
        write_checkpoint(directory, args.layers, s)
        size = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
        print(f"wrote {directory} ({size / 2**30:.2f} GiB) in {time.perf_counter() - t:.0f} s", flush=True)
    gguf, why_not = directory.with_suffix(".gguf"), None
    if not args.llama_bench:
        why_not = "no --llama-bench given"
    elif not gguf.exists():
        converter = args.convert or next(iter(sorted(glob.glob(CONVERTERS))), None)
        if converter is None:
            why_not = f"no convert_hf_to_gguf.py (--convert; none at {CONVERTERS})"
        else:
            t = time.perf_counter()
            try:
                convert_to_gguf(directory, converter, gguf)
                print(f"converted to {gguf} ({gguf.stat().st_size / 2**30:.2f} GiB) in {time.perf_counter() - t:.0f} s",
                      flush=True)
            except RuntimeError as e:
                why_not = str(e)

    ours: list[dict] = []
    theirs: list[tuple[float, float]] = []  # (prefill, decode) tok/s
    for round_ in range(args.rounds):
        command = [sys.executable, __file__, "--dir", str(args.dir), "--layers", str(args.layers), "--prompt",
                   str(args.prompt), "--new", str(args.new), "--threads", str(args.threads), "--device", args.device,
                   "--round", str(round_), "--one"] + (["--quick"] if args.quick else [])
        worker = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        ours.append(json.loads(worker.strip().splitlines()[-1]))
        progress = (f"copy {ours[-1]['bandwidth'] / 1e9:.1f} GB/s, read {ours[-1]['stream'] / 1e9:.1f} GB/s; "
                    f"llaisys prefill {ours[-1]['prefill']:.1f}, decode {ours[-1]['decode']:.2f}")
        if why_not is None:
            try:
                theirs.append((run_llama_bench(args.llama_bench, gguf, args.threads, "-p", str(args.prompt), "-n", "0"),
                               run_llama_bench(args.llama_bench, gguf, args.threads, "-p", "0", "-n", str(args.new),
                                               "-d", str(depth))))
                progress += f"; llama.cpp prefill {theirs[-1][0]:.1f}, decode {theirs[-1][1]:.2f}"
            except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
                why_not = f"llama-bench could not run the file: {e}"
        print(f"round {round_ + 1}: {progress} tok/s (load average {os.getloadavg()[0]:.1f})", flush=True)
    if why_not is not None:
        theirs = []
        print(f"llama.cpp: not compared ({why_not})")

    context = args.prompt + (args.new + 1) / 2  # decode's mean context (the prompt, then one more per step)
    parts = active_bytes(args.layers, s, context)
    active = sum(parts.values())
    mine = ours[0]
    kv_model = mine["kv_per_token"] * context
    params = total_parameters(args.layers, s)
    print(f"\n{directory.name} ({mine['model']}): {args.layers} layers ({s['dense_layers']} dense), {s['experts']} "
          f"experts top {s['top_k']} + {s['shared']} shared, {params / 1e9:.3g} B parameters; prompt {args.prompt}, "
          f"{args.new} new; {args.device}, {args.threads} threads, {args.rounds} rounds (medians); load average "
          f"{os.getloadavg()[0]:.1f}")
    print("active bytes per decode token (bf16): " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in parts.items())
          + f"; total {active / 2**30:.3f} GiB")
    print(f"  (llaisys' decode_bytes on the loaded model: weights {mine['weights'] / 2**30:.3f} GiB against "
          f"{(active - parts['kv']) / 2**30:.3f} here, {mine['weights'] / (active - parts['kv']):.4f}x; the KV "
          f"term from its pool {kv_model / 2**20:.2f} MiB against {parts['kv'] / 2**20:.2f})")
    copy = statistics.median(r["bandwidth"] for r in ours)
    read = statistics.median(r["stream"] for r in ours)
    print(f"memory rate (medians of the rounds): copy_bandwidth {copy / 1e9:.1f} GB/s, bound {copy / active:.2f} "
          f"tok/s; bf16 linear read {read / 1e9:.1f} GB/s, bound {read / active:.2f} tok/s")
    print(f"{'test':18} {'llaisys tok/s':>14} {'of copy':>8} {'of read':>8} {'llama.cpp tok/s':>16} {'of copy':>8} "
          f"{'of read':>8} {'llaisys/llama.cpp':>18}")

    def of_bounds(tps: float, decoding: bool) -> str:
        return f" {tps * active / copy:8.0%} {tps * active / read:8.0%}" if decoding else f" {'-':>8} {'-':>8}"

    for name, key, index in ((f"decode tg{args.new}@{args.prompt}", "decode", 1),
                             (f"prefill pp{args.prompt}", "prefill", 0)):
        tps = statistics.median(r[key] for r in ours)
        row = f"{name:18} {tps:14.2f}" + of_bounds(tps, key == "decode")
        if theirs:
            other = statistics.median(t[index] for t in theirs)
            ratio = statistics.median(r[key] / t[index] for r, t in zip(ours, theirs))  # per round, then the median
            row += f" {other:16.2f}" + of_bounds(other, key == "decode") + f" {ratio:17.2f}x"
        print(row)
    if theirs:
        for name, key, index in (("decode", "decode", 1), ("prefill", "prefill", 0)):
            print(f"  llaisys/llama.cpp {name} per round: "
                  + ", ".join(f"{r[key] / t[index]:.2f}x" for r, t in zip(ours, theirs)))
        print(f"  (llama.cpp: llama-bench -p {args.prompt} -n 0, and -p 0 -n {args.new} -d {depth}; -t {args.threads} "
              f"-r 3)")
    print(f"llaisys: load {mine['load_s']:.1f} s, peak RSS {mine['peak'] / 2**30:.2f} GiB")

    heads, L = s["heads"], args.layers
    rows = [("MLA latent (llaisys pool)", mine["kv_per_token"],
             f"{L} x ({s['kv_lora_rank']} + {s['qk_rope']}) x 2 B"),
            (f"MHA, {heads} KV heads x 128", L * 2 * heads * 128 * 2, f"{L} x 2 x {heads} x 128 x 2 B"),
            ("HF's MLA cache, expanded", L * heads * (s["qk_nope"] + s["qk_rope"] + s["v_head"]) * 2,
             f"{L} x {heads} x ({s['qk_nope']} + {s['qk_rope']} + {s['v_head']}) x 2 B"),
            ("GQA, 4 KV heads x 128", L * 2 * 4 * 128 * 2, f"{L} x 2 x 4 x 128 x 2 B")]
    print(f"\nKV cache per token ({L} layers, bf16):")
    print(f"{'cache':28} {'bytes/token':>12} {'vs latent':>10}  basis")
    for name, nbytes, basis in rows:
        print(f"{name:28} {nbytes:12.0f} {nbytes / mine['kv_per_token']:9.2f}x  {basis}")


if __name__ == "__main__":
    main()
