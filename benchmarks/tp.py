#!/usr/bin/env python
"""Tensor parallelism: decode speed of a model split over N ranks against the same model on one rank.

    python benchmarks/make_model.py --out /tmp/qwen2-1.5b-random
    flock /work/bench.lock python benchmarks/tp.py --model /tmp/qwen2-1.5b-random              # CPU: TP=2 vs TP=1
    python benchmarks/tp.py --model /tmp/qwen2-1.5b-random --device cuda                       # every GPU vs one
    python benchmarks/tp.py --model M --device cuda --tensor-parallel 1 --through-communicator  # one GPU, via NCCL
    python benchmarks/tp.py --model /tmp/moe-blocks/moe-12l-q4_k_m.gguf --dtype float32       # a GGUF file (MoE)

On the CPU the comparison is at equal cores: TP=1 with all of them (OMP_NUM_THREADS = cores), TP=N with
N ranks of cores/N threads each. Each configuration runs in its own process (a rank's thread count is
fixed when its CPU backend starts), alternately, ``--rounds`` times; the table shows medians and the ratio.
Greedy decoding, bf16 (``--dtype``), ``--decode-tokens`` new tokens after a 16-token prompt, EOS ignored; the split
model's tokens are checked against the one-rank model's (in bf16 they may part at a near-tie, and a random
model's logits are nearly flat: the 1.5B shape's first two logits tie exactly in bf16; ``--dtype float32``
gives the same tokens; the count of steps before they part is printed).

The collectives' cost per decode step is measured apart, by ranks doing only collectives of a decode step's
sizes (an all-reduce of [1, hidden] after o_proj and after down_proj in every layer, an all-gather of the
logits' [1, vocab / N], and rank 0's broadcast of the step's inputs): their time per step, and its share of a
split decode step.
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

PROMPT = 16
SEED = 1234


def prompt(vocab: int) -> list[int]:
    return np.random.default_rng(SEED).integers(0, vocab, size=PROMPT).tolist()


def model_sizes(path: Path) -> tuple[int, int, int]:
    """(vocabulary, hidden size, layers) of the model at ``path``: a HuggingFace directory or a GGUF file."""
    from llaisys_models.loading.loader import model_config

    config = model_config(path)
    return config.vocab_size, config.hidden_size, config.num_hidden_layers


def run_decode(args) -> dict:
    """One configuration (this process is rank 0): load, warm up, decode."""
    import llaisys_models

    vocab, _, _ = model_sizes(args.model)
    t0 = time.perf_counter()
    if args.ranks == 1 and not args.through_communicator:
        model = llaisys_models.load(args.model, device=args.device, dtype=args.dtype, progress=False)
    else:
        from llaisys_models.parallel.launch import load_parallel

        model = load_parallel(args.model, args.ranks, device=args.device, dtype=args.dtype, progress=False)
    load = time.perf_counter() - t0
    ids = prompt(vocab)
    model.generate(ids, 2, eos_token_ids=())  # warm-up: pages in, decode graphs captured
    tokens = model.generate(ids, args.decode_tokens, eos_token_ids=())[PROMPT:]
    stats = model.last_stats
    model.close()
    return {"load_s": load, "decode": stats.decode_tokens_per_second, "tokens": tokens}


def run_collectives(args) -> dict:
    """A decode step's collectives, without the model (this process is rank ``args.rank`` of ``args.ranks``)."""
    import llaisys

    vocab, hidden_size, layers = model_sizes(args.model)
    device = args.device if args.device == "cpu" else f"{args.device}:{args.rank}"
    group = llaisys.distributed.Group(bytes.fromhex(args.unique_id), args.rank, args.ranks, device)
    hidden = llaisys.zeros((1, hidden_size), "bfloat16", device)
    per = -(-vocab // args.ranks)
    logits, gathered = llaisys.zeros((1, per), "bfloat16", device), llaisys.empty((args.ranks, 1, per), "bfloat16", device)
    from llaisys_models.parallel.messages import FIRST

    message = llaisys.zeros((FIRST,), "int64", device)  # a decode step's inputs: one broadcast
    steps, times = 200, {}
    for name, op, count in (("all_reduce", lambda: group.all_reduce(hidden), 2 * layers),
                            ("all_gather", lambda: group.all_gather(gathered, logits), 1),
                            ("broadcast", lambda: group.broadcast(message, 0), 1)):
        for _ in range(20):
            op()
        llaisys.synchronize(device)
        group.barrier()
        t0 = time.perf_counter()
        for _ in range(steps * count if name == "all_reduce" else steps):
            op()
        llaisys.synchronize(device)
        times[name] = (time.perf_counter() - t0) / steps  # per decode step
    group.destroy()
    return times


def child(args, engine: str, ranks: int, threads: int | None, **extra) -> subprocess.Popen:
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    command = [sys.executable, __file__, "--model", str(args.model), "--device", args.device, "--engine", engine,
               "--ranks", str(ranks), "--decode-tokens", str(args.decode_tokens), "--dtype", args.dtype]
    if args.through_communicator:
        command.append("--through-communicator")
    for key, value in extra.items():
        command += [f"--{key.replace('_', '-')}", str(value)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)


def result(process: subprocess.Popen) -> dict:
    out, _ = process.communicate()
    if process.returncode:
        raise SystemExit(f"a benchmark process failed (exit {process.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="tensor-parallel decode against one rank")
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (ranks on cuda:0 .. cuda:N-1)")
    ap.add_argument("--tensor-parallel", type=int, default=None,
                    help="ranks (default: 2 on the CPU; on cuda as many GPUs as the model splits over evenly)")
    ap.add_argument("--through-communicator", action="store_true",
                    help="with --tensor-parallel 1: run the one rank through a communicator of one (NCCL on cuda)")
    ap.add_argument("--decode-tokens", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--engine", choices=["decode", "collectives"], help=argparse.SUPPRESS)
    ap.add_argument("--ranks", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--unique-id", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.engine == "decode":
        print(json.dumps(run_decode(args)))
        return 0
    if args.engine == "collectives":
        print(json.dumps(run_collectives(args)))
        return 0

    import llaisys

    cores = len(os.sched_getaffinity(0))
    if args.tensor_parallel is None:
        args.tensor_parallel = 2 if args.device == "cpu" else largest_split(args.model, len(
            [d for d in llaisys.available_devices() if d.type == args.device]))
    n = args.tensor_parallel
    cpu = args.device == "cpu"
    one_label = f"TP=1, {cores} threads" if cpu else "TP=1"
    split_label = f"TP={n}, {max(1, cores // n)} thread(s) each" if cpu else f"TP={n}"
    if n == 1:
        split_label += " through the communicator" if args.through_communicator else ""
    print(f"{args.model.name}, {args.device}, {args.dtype}, {args.decode_tokens} decode tokens after {PROMPT}; "
          f"load average {os.getloadavg()[0]:.1f} on {cores} cores", flush=True)
    runs: dict[str, list[dict]] = {one_label: [], split_label: []}
    for _ in range(args.rounds):  # alternately, each in a fresh process
        runs[one_label].append(result(child_one(args, cores if cpu else None)))
        runs[split_label].append(result(child(args, "decode", n, max(1, cores // n) if cpu else None)))

    uid = llaisys.distributed.unique_id(args.device)
    ranks = [child(args, "collectives", n, 1 if cpu else None, rank=r, unique_id=uid.hex()) for r in range(n)]
    collectives = result(ranks[0])
    for rank in ranks[1:]:
        result(rank)

    one_speed = float(np.median([r["decode"] for r in runs[one_label]]))
    split_speed = float(np.median([r["decode"] for r in runs[split_label]]))
    reference = runs[one_label][0]["tokens"]
    same = min(next((i for i, (a, b) in enumerate(zip(reference, r["tokens"])) if a != b), len(reference))
               for r in runs[split_label])
    print(f"\n{'configuration':40s} {'decode tok/s':>13s} {'ms/token':>9s} {'load s':>7s}  runs")
    for label, speed in ((one_label, one_speed), (split_label, split_speed)):
        loads = np.median([r["load_s"] for r in runs[label]])
        print(f"{label:40s} {speed:13.2f} {1000 / speed:9.1f} {loads:7.1f}  "
              + " ".join(f"{r['decode']:.2f}" for r in runs[label]))
    print(f"{'ratio (split / one rank)':40s} {split_speed / one_speed:13.2f}")
    print(f"greedy tokens: the split model's equal the one rank's for the first {same} of {len(reference)}")
    step_ms = 1000 / split_speed
    total = sum(collectives.values()) * 1000
    print(f"\ncollectives per decode step ({n} ranks, alone):")
    for name, seconds in collectives.items():
        print(f"  {name:12s} {seconds * 1e6:9.1f} us")
    print(f"  {'total':12s} {total * 1000:9.1f} us = {100 * total / step_ms:.1f}% of a split decode step ({step_ms:.1f} ms)")
    return 0


def largest_split(model: Path, devices: int) -> int:
    """The most ranks, at most ``devices``, that the model splits over evenly."""
    from llaisys_models.errors import ModelLoadError
    from llaisys_models.parallel.launch import read_config
    from llaisys_models.parallel.layout import Layout

    config = read_config(model)
    for ranks in range(devices, 1, -1):
        try:
            Layout.check(config, ranks)
            return ranks
        except ModelLoadError:
            continue
    return 1


def child_one(args, threads: int | None) -> subprocess.Popen:
    saved, args.through_communicator = args.through_communicator, False
    try:
        return child(args, "decode", 1, threads)
    finally:
        args.through_communicator = saved


if __name__ == "__main__":
    sys.exit(main())
