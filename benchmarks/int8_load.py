#!/usr/bin/env python
"""quantize="int8" load benchmark: load time, peak RSS against the weights, resident memory and decode speed.

    python benchmarks/make_model.py --out /tmp/qwen2-1.5b        # the 1.5B shape, random bf16
    python benchmarks/int8_load.py --model /tmp/qwen2-1.5b

Each mode (the bf16 checkpoint as stored, the reference row; then int8) runs in its own process, so peak
RSS is its own. Per mode: load time; the weights' bytes (int8 linears with their bf16 scales, the rest in
the model dtype); peak RSS during the load and its ratio to the weights (held to <= 1.1x); RSS
after a short greedy generation (the weights actually resident: a bf16 load maps the files and pages
them in as the first tokens read them); decode tok/s of that generation.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from gguf_load import status_bytes

GB = 1e9


def weight_bytes(model) -> tuple[int, int]:
    """(all weights, the int8 linears' part) in bytes."""
    from llaisys_models.loading.quantize import Int8Weight

    w = model.weights
    parts = [w.embed_tokens, w.norm] + ([w.lm_head] if w.lm_head is not w.embed_tokens else [])
    parts += [t for layer in w.layers for t in vars(layer).values() if t is not None]

    def size(t):
        return t.weight.nbytes + t.scales.nbytes if isinstance(t, Int8Weight) else t.nbytes

    return sum(map(size, parts)), sum(size(t) for t in parts if isinstance(t, Int8Weight))


def run_one(model_dir: str, quantize: str | None, new_tokens: int) -> dict:
    import llaisys_models

    before = status_bytes("VmRSS")
    t0 = time.perf_counter()
    model = llaisys_models.load(model_dir, device="cpu", quantize=quantize)
    load_s = time.perf_counter() - t0
    peak = status_bytes("VmHWM")
    total, int8 = weight_bytes(model)
    prompt = list(range(1000, 1016))
    model.generate(prompt, new_tokens, eos_token_ids=())
    return dict(mode=quantize or model.dtype.name, load_s=load_s, weights=total, int8=int8, before=before,
                peak=peak, resident=status_bytes("VmRSS"), decode_tps=model.last_stats.decode_tokens_per_second)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="HF safetensors directory (e.g. /tmp/qwen2-1.5b)")
    parser.add_argument("--new-tokens", type=int, default=8, help="greedy tokens generated after the load")
    parser.add_argument("--one", choices=["bf16", "int8"], help=argparse.SUPPRESS)  # a worker process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.model, None if args.one == "bf16" else args.one, args.new_tokens)))
        return 0
    rows = []
    for mode in ("bf16", "int8"):
        out = subprocess.run([sys.executable, __file__, "--model", args.model, "--new-tokens", str(args.new_tokens),
                              "--one", mode], check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    ref = rows[0]
    print(f"{'mode':8} {'load s':>7} {'weights GB':>11} {'(int8 part)':>11} {'peak RSS GB':>12} {'peak/weights':>13} "
          f"{'resident GB':>12} {'vs bf16':>8} {'decode tok/s':>13} {'vs bf16':>8}")
    for r in rows:
        print(f"{r['mode']:8} {r['load_s']:7.2f} {r['weights'] / GB:11.3f} {r['int8'] / GB:11.3f} {r['peak'] / GB:12.3f} "
              f"{r['peak'] / r['weights']:13.3f} {r['resident'] / GB:12.3f} {r['resident'] / ref['resident']:8.2f} "
              f"{r['decode_tps']:13.2f} {r['decode_tps'] / ref['decode_tps']:8.2f}")
    print(f"(process RSS before loading: {rows[1]['before'] / GB:.3f} GB; a bf16 load maps the files, so its peak "
          f"during the load is not its resident size)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
