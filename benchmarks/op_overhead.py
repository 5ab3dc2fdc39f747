"""Fixed cost of one op call from Python to a kernel and back (tiny tensors, so the kernel is ~free).

    python benchmarks/op_overhead.py            # per-call costs, then the decode-step cost
    python benchmarks/op_overhead.py --calls    # per-call costs only
    python benchmarks/op_overhead.py --decode   # decode-step cost only

Per call: microseconds for the raw ctypes call of the C export and for the public
llaisys.ops frontend (validation + dispatch), next to torch's own per-op overhead for the
same tiny op; the ratio column is against the raw ctypes call of the same op.

Decode step: a checkpoint with the structure of Qwen2-1.5B (28 layers, 12 query heads,
2 KV heads, qkv biases, untied lm_head) but tiny widths (head_dim 8), so every op call of
a real decode step happens while the kernels cost next to nothing. It reports the
milliseconds of one ``session.forward([token])`` with these tiny kernels and with every
kernel stubbed out (a Python no-op in the kernel cache): the latter is the pure Python
cost of the step, which an accelerator cannot hide.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import struct
import tempfile
import time
import timeit
from pathlib import Path

import numpy as np
import torch

import llaisys
from llaisys.plugins import registry


def per_call_us(fns: dict, number=20000, rounds=7) -> dict:
    """Microseconds per call of each function: the best of ``rounds`` rounds, the functions interleaved
    within each round, so that load from other processes hits them alike and their ratios hold."""
    best = dict.fromkeys(fns, float("inf"))
    for fn in fns.values():
        fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            best[name] = min(best[name], timeit.timeit(fn, number=number) / number * 1e6)
    return best


def raw_export(op: str):
    """The CPU library's export for ``op`` as a bare ctypes function (its own argtypes, no checks)."""
    from llaisys.abi import OP_LEADING_ARGS, OP_SLOTS
    fn = ctypes.CDLL(registry().backend("cpu").lib.path)[f"llaisys_cpu_{op}"]
    fn.restype = ctypes.c_int
    fn.argtypes = [*OP_LEADING_ARGS, *OP_SLOTS[op]]
    return fn


def print_table(header, rows):
    width = max(len(r[0]) for r in rows)
    print(f"{header:<{width}}  us/call   x raw")
    for name, us, ratio in rows:
        print((f"{name:<{width}}  {us:7.2f}  " + (f"{ratio:6.2f}" if ratio else "")).rstrip())


def call_costs():
    x = llaisys.from_numpy(np.ones((1,), np.float32))
    out = llaisys.empty((1,))
    raw_rearrange_fn = raw_export("rearrange")
    raw_add_fn = raw_export("add")
    shape = (ctypes.c_int64 * 1)(1)
    strides = (ctypes.c_int64 * 1)(1)
    a, b, c = (llaisys.from_numpy(np.ones((1,), np.float32)) for _ in range(3))
    pa, pb, pc, px, pout = a.data_ptr(), b.data_ptr(), c.data_ptr(), x.data_ptr(), out.data_ptr()
    tx, tout = torch.ones(1), torch.empty(1)

    raw_add = "raw ctypes call: llaisys_cpu_add (1 element)"
    raw_copy = "raw ctypes call: llaisys_cpu_rearrange (1 element)"
    calls = [  # (name, call, the raw call it is compared with)
        (raw_add, lambda: raw_add_fn(0, None, 0, 1, pc, pa, pb), raw_add),
        ("llaisys.ops.add (1 element)", lambda: llaisys.ops.add(c, a, b), raw_add),
        ("torch.add(out=) (1 element)", lambda: torch.add(tx, tx, out=tout), raw_add),
        (raw_copy, lambda: raw_rearrange_fn(0, None, 4, 1, shape, pout, strides, px, strides), raw_copy),
        ("llaisys.ops.rearrange (validate + dispatch)", lambda: llaisys.ops.rearrange(out, x), raw_copy),
        ("torch: tout.copy_(tx)", lambda: tout.copy_(tx), raw_copy),
        ("llaisys.empty((1,)) (cached allocation)", lambda: llaisys.empty((1,)), None),
        ("torch.empty(1)", lambda: torch.empty(1), None),
        ("t.slice(0, 0, 1)", lambda: a.slice(0, 0, 1), None),
        ("t.view(1)", lambda: a.view(1), None),
    ]
    us = per_call_us({name: fn for name, fn, _ in calls})
    print_table("call", [(name, us[name], us[name] / us[ref] if ref else None) for name, _, ref in calls])


# -- the decode step --------------------------------------------------------------------------

# Qwen2-1.5B's structure (layer count, head counts, biases) with tiny widths.
TINY_15B = dict(vocab_size=128, hidden_size=96, intermediate_size=64, num_hidden_layers=28,
                num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=4096)


def write_tiny_checkpoint(folder: Path) -> None:
    c = TINY_15B
    h, inter, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                   p + "self_attn.q_proj.weight": (h, h), p + "self_attn.q_proj.bias": (h,),
                   p + "self_attn.k_proj.weight": (kv, h), p + "self_attn.k_proj.bias": (kv,),
                   p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.v_proj.bias": (kv,),
                   p + "self_attn.o_proj.weight": (h, h), p + "mlp.gate_proj.weight": (inter, h),
                   p + "mlp.up_proj.weight": (inter, h), p + "mlp.down_proj.weight": (h, inter)}
    rng = np.random.default_rng(0)
    header, blobs, offset = {}, [], 0
    for name, shape in shapes.items():
        data = (rng.standard_normal(shape) * 0.05 + (1.0 if "norm" in name else 0.0)).astype(np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **TINY_15B, "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "tie_word_embeddings": False, "eos_token_id": 0, "torch_dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(config))


def count_op_calls(step) -> int:
    """Op calls made by ``step()``, counted by wrapping the public frontends."""
    count = 0
    originals = {name: getattr(llaisys.ops, name) for name in llaisys.ops.__all__}

    def counted(fn):
        def wrapper(*args, **kwargs):
            nonlocal count
            count += 1
            return fn(*args, **kwargs)
        return wrapper

    for name, fn in originals.items():
        setattr(llaisys.ops, name, counted(fn))
    try:
        step()
    finally:
        for name, fn in originals.items():
            setattr(llaisys.ops, name, fn)
    return count


def _noop_kernel(*args) -> int:
    return 0


def stub_kernels(device_type: str):
    """Every kernel of ``device_type`` becomes a Python no-op; returns a function that undoes it."""
    from llaisys.ops._dispatch import clear_plans
    backend = registry().backend(device_type)
    backend.kernel = lambda op: _noop_kernel  # the instance attribute shadows the method
    clear_plans()

    def undo():
        del backend.kernel
        clear_plans()
    return undo


def step_ms(model, steps: int) -> float:
    """Milliseconds of one decode ``forward`` (best of 5 runs of ``steps`` steps from the same cache)."""
    prompt = [1, 2, 3]
    best = float("inf")
    for _ in range(5):
        session = model.session()
        session.forward(prompt)
        t0 = time.perf_counter()
        for i in range(steps):
            session.forward([4 + i % 100])
        best = min(best, (time.perf_counter() - t0) / steps * 1e3)
    return best


def decode_costs(steps: int):
    import llaisys_models

    with tempfile.TemporaryDirectory() as folder:
        write_tiny_checkpoint(Path(folder))
        model = llaisys_models.load(folder, device="cpu")
        session = model.session()
        session.forward([1, 2, 3])
        calls = count_op_calls(lambda: session.forward([4]))
        tiny = step_ms(model, steps)
        undo = stub_kernels("cpu")
        try:
            stubbed = step_ms(model, steps)
        finally:
            undo()
    print(f"\ndecode step of a Qwen2-1.5B-structured model (28 layers, {calls} op calls per step)")
    print(f"  tiny kernels     {tiny:6.3f} ms/step  ({tiny / calls * 1e3:5.2f} us/op call)")
    print(f"  stubbed kernels  {stubbed:6.3f} ms/step  ({stubbed / calls * 1e3:5.2f} us/op call)  "
          f"<- Python-side cost (target <= 1.5 ms)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", action="store_true", help="per-call costs only")
    ap.add_argument("--decode", action="store_true", help="decode-step cost only")
    ap.add_argument("--steps", type=int, default=100, help="decode steps per timed run")
    args = ap.parse_args()
    both = not (args.calls or args.decode)
    if args.calls or both:
        call_costs()
    if args.decode or both:
        decode_costs(args.steps)


if __name__ == "__main__":
    main()
