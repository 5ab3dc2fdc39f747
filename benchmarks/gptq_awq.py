#!/usr/bin/env python
"""GPTQ and AWQ checkpoints kept in 4 / 8 bits (linear_gq): decode speed against a Q4_0 GGUF of the same model, and a
load's peak memory against the checkpoint's size, in one run.

    python benchmarks/gptq_awq.py --work-dir /tmp/gptq-awq-bench            # both parts, ~8 min the first time
    python benchmarks/gptq_awq.py --models gptq4 --skip-memory --rounds 5 --profile-rows 0

The files are made under --work-dir on the first run and reused afterwards:

- a random bf16 model of the DeepSeek-R1-Distill-Qwen-1.5B shape (benchmarks/make_model.py) and a mid-size one
  (Qwen2, hidden 1024, 8 layers, intermediate 2816, 16 / 4 heads, vocab 32000);
- their GPTQ (v1, symmetric, group 128: 4 and 8 bits, and 4 bits with the lm_head quantized too, "gptq4-lmhead",
  GPTQModel's lm_head=True) and (the mid-size one) AWQ GEMM (4 bits, group 128, zero points) directories, quantized
  by round-to-nearest per group and packed by tests/helpers/gptq_awq_pack.py (the tests' packer, one tensor at a
  time here; the embeddings, norms, biases and float lm_head in float16, as the tools publish them);
- the 1.5B model as a Q4_0 GGUF file (benchmarks/gguf_load.py's writer: every matrix Q4_0, the gguf package's
  quantizer).

1. Decode (one child process holding every model): greedy decode of --new tokens after a --prompt-token prompt, a
   warm-up each, then --rounds rounds alternating the models; best of the rounds. The bound is ``llaisys bench``'s:
   the bytes a decode step reads (llaisys_models.bench.bandwidth.decode_bytes: every matrix as held, with its
   scales and zero points; the KV cache) over the copy bandwidth measured through llaisys before and after the
   rounds (the higher reading). Columns: tok/s, ratio to the Q4_0 file's, GB read per token, fraction of the bound.
   Then one more decode per model under llaisys.profile, its steps run eagerly (not replayed from the captured
   decode graph, whose ops the profiler does not see): the slowest ops per step (--profile-rows).
2. Load memory (a fresh child process per row): VmHWM reset through /proc/self/clear_refs after the imports, then
   ``llaisys_models.load``; the peak's growth over the RSS before the load against the files' size (the issue's
   target for a kept load: <= 1.5x; a dequantized load widens the linears into the compute dtype, float16 here).
   The float tensors stay mapped and are paged in when first read, so the peak after two greedy tokens
   ("running") is shown too. Rows: the mid-size model as bf16 (reference), each format kept and dequantized;
   then the 1.5B checkpoints of part 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT / "tests" / "helpers")]
import gptq_awq_pack as pack  # noqa: E402
import make_model  # noqa: E402
from gguf_load import status_bytes, write_gguf  # noqa: E402

GB = 1e9
MID_SHAPE = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                 num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096)
QUANTS = {"gptq4": pack.Quant(bits=4, group_size=128, sym=True, v1=True),
          "gptq8": pack.Quant(bits=8, group_size=128, sym=True, v1=True),
          "gptq4-lmhead": pack.Quant(bits=4, group_size=128, sym=True, v1=True, lm_head=True),
          "awq4": pack.Quant(method="awq", bits=4, group_size=128)}
PROMPT_SEED = 1234


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- the files ----------------------------------------------------------------------------------------------------


def float_model(directory: Path, shape: dict) -> Path:
    """A random bf16 Qwen2 checkpoint of ``shape`` in ``directory`` (made once: a "done" file marks it complete)."""
    if (directory / "done").exists():
        return directory
    t0 = time.perf_counter()
    directory.mkdir(parents=True, exist_ok=True)
    config = make_model.config(shape)
    if shape["vocab_size"] <= config["eos_token_id"]:
        config.update(bos_token_id=0, eos_token_id=0)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    make_model.write_safetensors(directory / "model.safetensors", make_model.tensors(shape), seed=0)
    (directory / "done").touch()
    log(f"made {directory} in {time.perf_counter() - t0:.0f}s")
    return directory


def quantized_tensors(name: str, w: np.ndarray, q: pack.Quant, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One float checkpoint tensor as the quantized checkpoint stores it: a linear's packed tensors, else float16."""
    module = pack.quantized_module(name)
    how = q.module(module) if module is not None else None
    if how is None:
        return {name: w.astype(np.float16)}
    g_idx = pack.group_index(w.shape[1], how, rng)
    codes, zeros, scales = pack.rtn(w.astype(np.float64), how, g_idx)
    if how.method == "awq":
        parts = pack.pack_awq(codes, zeros, scales)
    else:
        parts = pack.pack_gptq(codes, zeros, scales, g_idx, how.bits, how.v1)
    return {f"{module}.{field}": t for field, t in parts.items()}


def quantized_model(float_dir: Path, out: Path, q: pack.Quant) -> Path:
    """``float_dir`` quantized as ``q`` says into ``out`` (made once), a tensor at a time from the mapped file (the
    packer's write_checkpoints holds the whole model and writes a float32 reference beside it)."""
    from safetensors.numpy import save_file

    from llaisys_models.loading.safetensors import Checkpoint

    if (out / "done").exists():
        return out
    t0 = time.perf_counter()
    checkpoint = Checkpoint(float_dir)
    rng = np.random.default_rng(q.seed)
    state: dict[str, np.ndarray] = {}
    for name in checkpoint.infos:
        state.update(quantized_tensors(name, checkpoint.tensor(name).numpy(), q, rng))
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((float_dir / "config.json").read_text())
    config.update(quantization_config=q.config(), torch_dtype="float16")
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "done").touch()
    log(f"packed {out} in {time.perf_counter() - t0:.0f}s")
    return out


def q4_0_gguf(float_dir: Path, path: Path) -> Path:
    """``float_dir`` as a Q4_0 GGUF file (made once)."""
    if not path.exists():
        t0 = time.perf_counter()
        partial = path.with_suffix(".partial")
        write_gguf(float_dir, partial, "Q4_0")
        partial.rename(path)
        log(f"wrote {path} in {time.perf_counter() - t0:.0f}s")
    return path


def file_bytes(path: Path) -> int:
    """The weights' bytes on disk: a GGUF file, or a directory's safetensors files."""
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.glob("*.safetensors"))


# -- the child processes ----------------------------------------------------------------------------------------


def decode_worker(paths: dict[str, str], prompt_tokens: int, new: int, rounds: int, profile: bool) -> dict:
    """Every model loaded, then ``rounds`` rounds alternating them: per model its decode rates, bytes per token,
    dtype and weight formats (and with ``profile`` the op table of one more decode, per step); the copy bandwidth
    (the higher of before and after the rounds)."""
    import llaisys
    import llaisys_models
    from llaisys_models.bench.bandwidth import copy_bandwidth, decode_bytes

    models = {label: llaisys_models.load(path, device="cpu", progress=False) for label, path in paths.items()}
    prompts = {label: np.random.default_rng(PROMPT_SEED).integers(0, m.config.vocab_size, prompt_tokens).tolist()
               for label, m in models.items()}

    def decode(label: str, prompt: list[int] | None = None) -> float:
        models[label].generate(prompt or prompts[label], new + 1, eos_token_ids=())
        return models[label].last_stats.decode_tokens_per_second  # the new steps after the first token

    for label in models:  # warm-up: pools, decode graphs, the weights' pages
        decode(label)
    bandwidth = copy_bandwidth(next(iter(models.values())).device)
    rates: dict[str, list[float]] = {label: [] for label in models}
    for r in range(rounds):
        for label in models:
            rates[label].append(decode(label))
        log(f"  decode round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rates.items()))
    bandwidth = max(bandwidth, copy_bandwidth(next(iter(models.values())).device))
    result = {label: {"rates": rates[label], "bytes": decode_bytes(m, new), "dtype": m.dtype.name,
                      "formats": "/".join(m.weight_formats)} for label, m in models.items()}
    if profile:
        for label, m in models.items():
            m._decode_graphs.enabled = False  # eager steps: the profiler does not see inside a replayed graph
            with llaisys.profile(shapes=True) as prof:  # a 1-token prompt: new + 1 forward steps of one token
                decode(label, prompts[label][:1])
            result[label]["profile"] = prof.table(per=new + 1, unit="token")
    return {"bandwidth": bandwidth, "models": result}


def load_worker(path: str, dequantize: bool) -> dict:
    """One load's time, RSS before and peak (VmHWM, reset after the imports), and the peak after two greedy tokens
of a 16-token prompt (the mapped float tensors, embeddings and lm_head, read by then)."""
    import llaisys_models
    import llaisys_models.loading.loader  # noqa: F401  (imported before the reset, as the load's modules)

    Path("/proc/self/clear_refs").write_text("5")  # VmHWM starts again from the current RSS
    before = status_bytes("VmRSS")
    t0 = time.perf_counter()
    model = llaisys_models.load(path, device="cpu", dequantize=dequantize, progress=False)
    load = {"load_s": time.perf_counter() - t0, "before": before, "peak": status_bytes("VmHWM")}
    model.generate(list(range(1, 17)), 2, eos_token_ids=())  # the lazily mapped tensors (embeddings, lm_head) read
    return {**load, "peak_running": status_bytes("VmHWM"), "dtype": model.dtype.name,
            "formats": "/".join(model.weight_formats)}


def child(args: argparse.Namespace, worker: str, payload: dict) -> dict:
    """Run ``worker`` in a fresh interpreter (this script with --worker), its result the last RESULT line."""
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    cmd = [sys.executable, __file__, "--worker", worker, "--payload", json.dumps(payload)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.stderr.strip():
        sys.stderr.write(proc.stderr)
    if proc.returncode or not lines:
        sys.stderr.write(proc.stdout[-3000:])
        raise SystemExit(f"{worker} {payload} failed (exit {proc.returncode})")
    return json.loads(lines[-1][len("RESULT "):])


# -- the two parts ----------------------------------------------------------------------------------------------


def decode_part(args: argparse.Namespace, paths: dict[str, Path]) -> None:
    payload = {"paths": {k: str(v) for k, v in paths.items()}, "prompt_tokens": args.prompt, "new": args.new,
               "rounds": args.rounds, "profile": args.profile}
    result = child(args, "decode", payload)
    bandwidth, models = result["bandwidth"], result["models"]
    ref = max(models["q4_0"]["rates"])
    print(f"\n1. Decode, the 1.5B shape: {args.new} greedy tokens after {args.prompt}, best of {args.rounds} rounds "
          f"(alternating), {args.threads} threads; copy bandwidth {bandwidth / GB:.1f} GB/s")
    header = (f"{'model':13} {'file GB':>8} {'dtype':>8} {'weights':>22} {'tok/s':>7} {'vs q4_0':>8} {'GB/token':>9} "
              f"{'bound tok/s':>12} {'of bound':>9}  rounds")
    print(header + "\n" + "-" * len(header))
    for label, m in models.items():
        best = max(m["rates"])
        bound = bandwidth / m["bytes"]
        print(f"{label:13} {file_bytes(paths[label]) / GB:8.3f} {m['dtype']:>8} {m['formats']:>22} {best:7.2f} "
              f"{best / ref:7.2f}x {m['bytes'] / GB:9.3f} {bound:12.1f} {best / bound:9.0%}  "
              + ", ".join(f"{r:.1f}" for r in m["rates"]))
    for label, m in models.items():
        if "profile" in m:
            lines = m["profile"].splitlines()  # header, ops slowest first, "(outside ops)", total
            print(f"\n{label}: one more decode (1-token prompt, eager steps), llaisys.profile(shapes=True), per step: "
                  f"the {args.profile_rows} slowest ops")
            print("\n".join(lines[:1] + lines[1:-2][:args.profile_rows] + lines[-2:]))


def memory_part(args: argparse.Namespace, rows: list[tuple[str, Path, bool]]) -> None:
    print("\n2. Load memory: a fresh process per row; grew = peak RSS (VmHWM) - RSS before the load (after the "
          "imports); running: the peak after two tokens")
    header = (f"{'model':28} {'file GB':>8} {'load s':>7} {'before GB':>10} {'peak GB':>8} {'grew/file':>10} "
              f"{'peak/file':>10} {'running GB':>11} {'running/file':>13}  weights")
    print(header + "\n" + "-" * len(header))
    for label, path, dequantize in rows:
        r = child(args, "load", {"path": str(path), "dequantize": dequantize})
        size = file_bytes(path)
        print(f"{label:28} {size / GB:8.3f} {r['load_s']:7.2f} {r['before'] / GB:10.3f} {r['peak'] / GB:8.3f} "
              f"{(r['peak'] - r['before']) / size:9.2f}x {r['peak'] / size:9.2f}x {r['peak_running'] / GB:11.3f} "
              f"{(r['peak_running'] - r['before']) / size:12.2f}x  {r['dtype']} {r['formats'] or 'float'}", flush=True)


def memory_rows(work: Path, big: dict[str, Path]) -> list[tuple[str, Path, bool]]:
    """(label, path, dequantize): the mid-size model's float checkpoint, then each format kept and dequantized;
    then the 1.5B checkpoints already made for the decode part."""
    mid = float_model(work / "mid-bf16", MID_SHAPE)
    rows = [("mid bf16 (float)", mid, False)]
    for label in ("gptq4", "gptq8", "awq4"):
        path = quantized_model(mid, work / f"mid-{label}", QUANTS[label])
        rows += [(f"mid {label}", path, False), (f"mid {label} dequantize", path, True)]
    for label, path in big.items():
        rows += [(f"1.5B {label}", path, False), (f"1.5B {label} dequantize", path, True)]
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/gptq-awq-bench"), help="where the files are kept")
    ap.add_argument("--models", default="gptq4,gptq8,gptq4-lmhead",
                    help="the 1.5B checkpoints beside the Q4_0 file (default: gptq4,gptq8,gptq4-lmhead)")
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens (default: 16)")
    ap.add_argument("--new", type=int, default=64, help="decode steps measured (default: 64)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating decode rounds, best taken (default: 3)")
    ap.add_argument("--profile-rows", type=int, default=6, help="op rows shown per model (0: no profiled decode)")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--clean", action="store_true", help="delete --work-dir's files first")
    ap.add_argument("--worker", choices=["decode", "load"], help=argparse.SUPPRESS)
    ap.add_argument("--payload", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker = decode_worker if args.worker == "decode" else load_worker
        print("RESULT " + json.dumps(worker(**json.loads(args.payload))), flush=True)
        return 0
    args.profile = args.profile_rows > 0
    labels = args.models.split(",")
    unknown = [label for label in labels if label not in QUANTS or label == "awq4"]
    if unknown:
        ap.error(f"--models: unknown {', '.join(unknown)} (gptq4, gptq8, gptq4-lmhead)")

    t0 = time.perf_counter()
    if args.clean:
        shutil.rmtree(args.work_dir, ignore_errors=True)
    print(f"{args.threads} threads, load average {os.getloadavg()[0]:.1f}, work dir {args.work_dir}", flush=True)
    big_float = float_model(args.work_dir / "1.5b-bf16", make_model.SHAPE)
    big = {label: quantized_model(big_float, args.work_dir / f"1.5b-{label}", QUANTS[label]) for label in labels}
    gguf = q4_0_gguf(big_float, args.work_dir / "1.5b-q4_0.gguf")
    made = time.perf_counter()
    if not args.skip_decode:
        decode_part(args, {**big, "q4_0": gguf})
    decoded = time.perf_counter()
    if not args.skip_memory:
        memory_part(args, memory_rows(args.work_dir, big))
    end = time.perf_counter()
    print(f"\ntotal {end - t0:.0f}s (1.5B files {made - t0:.0f}s, decode {decoded - made:.0f}s, memory "
          f"{end - decoded:.0f}s with the mid-size files), load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
