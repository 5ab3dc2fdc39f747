#!/usr/bin/env python
"""Multi-LoRA decoding: the base model, 4 adapters in one batch, a merged adapter, and llama.cpp's llama-server
on the same weights, paired in one run (alternating rounds).

    python benchmarks/lora.py --out /tmp/lora-bench --llama-server /work/llama/build/bin/llama-server
    python benchmarks/lora.py --out /tmp/lora-bench --layers 8 ...      # a smaller model of the same widths

The model is random, of DeepSeek-R1-Distill-Qwen-1.5B's shape (benchmarks/make_model.py: 28 layers, hidden 1536,
12 heads / 2 KV heads, intermediate 8960, bf16) unless ``--layers`` cuts it; 4 PEFT adapters (a, b, c, d) of rank
16 (alpha 32) on q, k, v, o, gate, up and down of every layer, A drawn as PEFT initializes it (uniform within
+-1/sqrt(K)) and B ~ N(0, 0.01^2), so that scale * B A moves each weight by ~6% of its spread, as a trained
adapter might. Everything is written once into ``--out`` (reused by later runs): the safetensors model, the
adapters (PEFT directories), the model as a GGUF file (``--llama-type``, BF16 by default: the same weights) and the
adapters as GGUF adapters (tests/helpers/lora_gguf.py, what llama.cpp's convert_lora_to_gguf.py writes; BF16).

Every configuration decodes --streams (8) prompts of --prompt-tokens random token ids, --new-tokens each, greedy,
never stopping at EOS:

1. llaisys, base: ``generate_batch(prompts, n)`` on a model with the 4 adapters loaded (no row uses one: no LoRA
   op runs);
2. llaisys, 4 adapters: the same call with ``lora=[a, a, b, b, c, c, d, d]``: one batch, every step runs each
   adapted linear's ``lora_shrink`` / ``lora_expand`` over the rows' adapters (the issue's target: >= 0.8x (1));
3. llaisys, merged: a second copy of the model with adapter a folded in (``merge_lora``), no adapter named
   (target: (1)'s speed);
4. llama-server (``-t --threads -np 8``, the prompts as token ids, ``temperature 0``, ``ignore_eos``, streamed):
   base (no adapter, 8 streams); (a) one server per adapter (``--lora X.gguf``), 2 streams each, the 4 servers one
   after the other (4 servers at once would be 8 threads on 2 cores and 4 copies of the weights: their sum can only
   be the same cores' time-sliced work); (b) one server with all 4 adapters (``--lora-init-without-apply``), each
   request naming its adapter in its ``"lora": [{"id": i, "scale": 1}]`` field (llama.cpp batches only requests
   of the same adapters, so at any step one adapter's 2 streams run).

Aggregate decode tok/s counts the tokens after each stream's first one and the time they took: for llaisys the
scheduler steps after the one that ran every prompt (the prompts' 8 x --prompt-tokens tokens fit one step:
``max_batch_tokens``), timed around ``Scheduler.step`` (the forward, the choice of the tokens, the host's work); for
llama-server, the union over the streams of [first token received, last token received] (a stream's prefill, or
a stream waiting for another adapter's turn before its prompt is read, is not in it). Medians over --rounds; the
ratio of a round is to llaisys' base in the same round; rounds alternate the order of the engines.

Then, unless --no-profile, one eager run of (1) and (2) (decode graphs off: the profiler cannot see inside a
replayed graph) under ``llaisys.profile()``: the decode steps' time per op, and the LoRA ops' share of a step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gguf_load import write_gguf  # noqa: E402
from make_model import SHAPE, tensors, write_safetensors  # noqa: E402
from make_model import config as hf_config  # noqa: E402

ADAPTERS = ("a", "b", "c", "d")
RANK, ALPHA = 16, 32
MODULES = {"self_attn.q_proj": "q", "self_attn.k_proj": "kv", "self_attn.v_proj": "kv", "self_attn.o_proj": "o",
           "mlp.gate_proj": "inter", "mlp.up_proj": "inter", "mlp.down_proj": "down"}
PROMPT_SEED = 4321


# -- the files -------------------------------------------------------------------------------------------------

def write_peft_adapter(out: Path, base: Path, shape: dict, seed: int) -> None:
    """A PEFT LoRA directory (adapter_config.json, adapter_model.safetensors in float32, as PEFT saves) over every
    linear of every layer of the model of ``shape``."""
    from safetensors.numpy import save_file

    h, inter = shape["hidden_size"], shape["intermediate_size"]
    kv = shape["num_key_value_heads"] * h // shape["num_attention_heads"]
    dims = {"q": (h, h), "kv": (kv, h), "o": (h, h), "inter": (inter, h), "down": (h, inter)}  # [N, K]
    rng = np.random.default_rng(seed)
    weights = {}
    for i in range(shape["num_hidden_layers"]):
        for module, kind in MODULES.items():
            n, k = dims[kind]
            prefix = f"base_model.model.model.layers.{i}.{module}"
            bound = 1 / math.sqrt(k)  # PEFT's A: kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(K), 1/sqrt(K))
            weights[prefix + ".lora_A.weight"] = rng.uniform(-bound, bound, (RANK, k)).astype(np.float32)
            weights[prefix + ".lora_B.weight"] = (0.01 * rng.standard_normal((n, RANK))).astype(np.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, out / "adapter_model.safetensors", metadata={"format": "pt"})
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base), "r": RANK,
        "lora_alpha": ALPHA, "lora_dropout": 0.0, "bias": "none", "target_modules": sorted(
            m.split(".")[1] for m in MODULES), "use_rslora": False, "use_dora": False, "fan_in_fan_out": False,
        "init_lora_weights": True, "rank_pattern": {}, "alpha_pattern": {}, "modules_to_save": None}, indent=2))


def prepare(args) -> dict[str, Path]:
    """Write (once) the model, its GGUF file, the adapters and theirs; their paths."""
    shape = dict(SHAPE, num_hidden_layers=args.layers)
    root = args.out / f"qwen2-1.5b-shape-{args.layers}-layers"
    paths = {"model": root / "model", "gguf": root / f"model-{args.llama_type.lower()}.gguf"}
    model = paths["model"]
    if not (model / "model.safetensors").exists():
        model.mkdir(parents=True, exist_ok=True)
        (model / "config.json").write_text(json.dumps(hf_config(shape), indent=2))
        write_safetensors(model / "model.safetensors.part", tensors(shape), seed=0)
        (model / "model.safetensors.part").rename(model / "model.safetensors")
    if not paths["gguf"].exists():
        write_gguf(model, paths["gguf"].with_suffix(".part"), args.llama_type, placeholder_vocab=True)
        paths["gguf"].with_suffix(".part").rename(paths["gguf"])
    for i, name in enumerate(ADAPTERS):
        peft = paths[name] = root / f"adapter-{name}"
        if not (peft / "adapter_config.json").exists():
            write_peft_adapter(peft, model, shape, seed=100 + i)
        gguf_file = paths[name + ".gguf"] = root / f"adapter-{name}-bf16.gguf"
        if not gguf_file.exists():
            sys.path.insert(0, str(HERE.parent / "tests"))
            from gguf import GGMLQuantizationType

            from helpers.lora_gguf import write_gguf_adapter

            write_gguf_adapter(peft, gguf_file.with_suffix(".part"), "qwen2", GGMLQuantizationType.BF16,
                               base_dir=model)
            gguf_file.with_suffix(".part").rename(gguf_file)
    return paths


def prompts(args, vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(PROMPT_SEED)
    return [rng.integers(0, vocab, size=args.prompt_tokens).tolist() for _ in range(args.streams)]


# -- llaisys ---------------------------------------------------------------------------------------------------

class StepClock:
    """Times every ``Scheduler.step`` of this process: (seconds, the sequences it gave a token, and the op
    seconds it added to ``prof`` while one is set)."""

    def __init__(self) -> None:
        from llaisys_models.engine.scheduler import Scheduler

        self.steps: list[tuple[float, list[int], dict[str, tuple[float, int]] | None]] = []
        self.prof = None
        original, clock = Scheduler.step, self

        def step(scheduler):
            prof = clock.prof
            before = (dict(prof.seconds), dict(prof.calls)) if prof is not None else None
            t0 = time.perf_counter()
            events = original(scheduler)
            seconds = time.perf_counter() - t0
            ops = None
            if before is not None:  # op -> (seconds, calls) of this step
                ops = {op: (s - before[0].get(op, 0.0), prof.calls[op] - before[1].get(op, 0))
                       for op, s in prof.seconds.items() if prof.calls[op] > before[1].get(op, 0)}
            clock.steps.append((seconds, [id(seq) for seq, _ in events], ops))
            return events

        Scheduler.step = step

    def run(self, model, batch: list[list[int]], new_tokens: int, lora) -> dict:
        """generate_batch of ``batch``; its decode steps: tokens, seconds, tok/s and op seconds summed, and the
        new tokens of each stream."""
        self.steps = []
        out = model.generate_batch(batch, new_tokens, eos_token_ids=(), lora=lora,
                                   max_batch_tokens=max(128, sum(len(p) for p in batch)))
        seen: set[int] = set()
        tokens, seconds, steps, step_seconds_all, ops = 0, 0.0, 0, [], []
        for step_seconds, seqs, step_ops in self.steps:
            if len(seen) == len(batch):  # every stream had its first token: a decode step
                tokens += len(seqs)
                seconds += step_seconds
                steps += 1
                step_seconds_all.append(step_seconds)
                ops.append(step_ops or {})
            seen.update(seqs)
        assert tokens == len(batch) * (new_tokens - 1), (tokens, len(batch), new_tokens)
        return {"tokens": tokens, "seconds": seconds, "steps": steps, "tok_s": tokens / seconds,
                "step_seconds": step_seconds_all, "ops": ops,
                "new": [o[len(p):] for o, p in zip(out, batch)]}


class Llaisys:
    """The two llaisys models: ``model`` with the 4 adapters loaded, ``merged`` with adapter a merged."""

    def __init__(self, paths: dict[str, Path]) -> None:
        import llaisys_models

        t0 = time.perf_counter()
        self.model = llaisys_models.load(paths["model"], device="cpu", progress=False)
        for name in ADAPTERS:
            self.model.load_lora(name, paths[name])
        self.merged = llaisys_models.load(paths["model"], device="cpu", progress=False)
        self.merged.load_lora("a", paths["a"])
        self.merged.merge_lora("a")
        print(f"llaisys: two models loaded, 4 adapters, one merged ({time.perf_counter() - t0:.1f} s)",
              file=sys.stderr, flush=True)
        self.clock = StepClock()

    def configs(self, streams: int):
        per = streams // len(ADAPTERS)
        mixed = [name for name in ADAPTERS for _ in range(per)] + [None] * (streams - per * len(ADAPTERS))
        return {"llaisys base": (self.model, None), "llaisys 4 adapters": (self.model, mixed),
                "llaisys merged": (self.merged, None)}

    def run(self, config: str, batch, new_tokens: int) -> tuple[float, list[list[int]]]:
        """Aggregate decode tok/s of ``config``, and each stream's new tokens."""
        model, lora = self.configs(len(batch))[config]
        result = self.clock.run(model, batch, new_tokens, lora)
        return result["tok_s"], result["new"]

    def profile(self, batch, new_tokens: int) -> dict[str, dict]:
        """Eager (graphs off) profiled decode steps of the base and the 4-adapter runs."""
        import llaisys

        graphs = self.model._decode_graphs  # (the profiler cannot time ops inside a replayed graph)
        enabled = graphs.enabled
        graphs.enabled = False
        out = {}
        try:
            for config in ("llaisys base", "llaisys 4 adapters"):
                model, lora = self.configs(len(batch))[config]
                self.clock.run(model, batch, 2, lora)  # warm-up, eager
                with llaisys.profile(shapes=True) as prof:
                    self.clock.prof = prof
                    try:
                        out[config] = self.clock.run(model, batch, new_tokens, lora)
                    finally:
                        self.clock.prof = None
        finally:
            graphs.enabled = enabled
        return out


# -- llama.cpp -------------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_server(args, paths: dict[str, Path], loras: list[str], apply: bool):
    """llama-server on the GGUF model with the GGUF adapters ``loras`` (applied to every request, or loaded at
    scale 0 for requests to name), until the block ends; yields its base URL."""
    port = free_port()
    ctx = args.streams * 256 * -(-(args.prompt_tokens + args.new_tokens + 8) // 256)
    cmd = [args.llama_server, "-m", str(paths["gguf"]), "-t", str(args.threads), "-tb", str(args.threads),
           "-c", str(ctx), "-np", str(args.streams), "--port", str(port), "--host", "127.0.0.1",
           "--cache-ram", "0", "--no-webui"]
    for name in loras:
        cmd += ["--lora", str(paths[name + ".gguf"])]
    if loras and not apply:
        cmd.append("--lora-init-without-apply")
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise SystemExit(f"llama-server exited with {proc.returncode}: {' '.join(cmd)}\n{log.read()[-4000:]}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            if time.monotonic() > deadline:
                raise SystemExit("llama-server did not come up within 600 s")
            time.sleep(0.25)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def completion(base: str, prompt: list[int], new_tokens: int, lora: list[dict] | None) -> dict:
    """One streamed /completion: when its first and last token came, and the server's counts."""
    body = {"prompt": prompt, "n_predict": new_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "cache_prompt": False, "return_tokens": True}
    if lora is not None:
        body["lora"] = lora
    request = urllib.request.Request(base + "/completion", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    first = last = None
    chunks = 0
    final: dict = {}
    new: list[int] = []
    with urllib.request.urlopen(request, timeout=3600) as r:
        for line in r:
            if not line.startswith(b"data: "):
                continue
            data = json.loads(line[6:])
            now = time.perf_counter()
            if data.get("tokens"):
                chunks += len(data["tokens"])
                new += data["tokens"]
                first = first if first is not None else now
                last = now
            if data.get("stop"):
                final = data
                break
    timings = final.get("timings", {})
    return {"first": first, "last": last, "chunks": chunks, "predicted_n": timings.get("predicted_n", chunks),
            "prompt_n": timings.get("prompt_n"), "new": new}


def streams_at_once(base: str, batch: list[list[int]], new_tokens: int, loras: list) -> list[dict]:
    results: list[dict | BaseException | None] = [None] * len(batch)
    barrier = threading.Barrier(len(batch))

    def one(i: int) -> None:
        barrier.wait()
        try:
            results[i] = completion(base, batch[i], new_tokens, loras[i])
        except BaseException as e:  # noqa: BLE001 (reported below)
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(batch))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]


def decode_window(results: list[dict]) -> tuple[int, float]:
    """Tokens after each stream's first, and the union of the streams' [first, last] token times."""
    spans = sorted((r["first"], r["last"]) for r in results)
    seconds, start, end = 0.0, *spans[0]
    for s, e in spans[1:]:
        if s > end:
            seconds += end - start
            start, end = s, e
        else:
            end = max(end, e)
    seconds += end - start
    return sum(r["predicted_n"] - 1 for r in results), seconds


def llama_run(args, paths, config: str, batch: list[list[int]]) -> tuple[float, list[list[int]]]:
    """Aggregate decode tok/s of one llama.cpp configuration (its servers started for it), and each stream's new
    tokens."""
    per = len(batch) // len(ADAPTERS)
    warm = [batch[0][:8]]
    tokens, seconds, new = 0, 0.0, []
    if config == "llama.cpp base":
        runs = [([], True, batch, [None] * len(batch))]
    elif config == "llama.cpp (a) 1 server/adapter":
        runs = [([name], True, batch[i * per:(i + 1) * per], [None] * per) for i, name in enumerate(ADAPTERS)]
    else:
        loras = [[{"id": j, "scale": 1.0 if j == i else 0.0} for j in range(len(ADAPTERS))]
                 for i in range(len(ADAPTERS)) for _ in range(per)]
        runs = [(list(ADAPTERS), False, batch[:len(loras)], loras)]
    for loras, apply, part, fields in runs:
        with llama_server(args, paths, loras, apply) as base:
            for field in {json.dumps(f) for f in fields}:  # warm-up, once per adapter choice
                completion(base, warm[0], 4, json.loads(field))
            results = streams_at_once(base, part, args.new_tokens, fields)
        for r in results:
            if r["predicted_n"] != args.new_tokens or r["prompt_n"] not in (None, args.prompt_tokens):
                raise SystemExit(f"{config}: a stream predicted {r['predicted_n']} tokens from a prompt of "
                                 f"{r['prompt_n']} (wanted {args.new_tokens} from {args.prompt_tokens})")
        t, s = decode_window(results)
        tokens, seconds = tokens + t, seconds + s
        new += [r["new"] for r in results]
    return tokens / seconds, new


# -- the run ---------------------------------------------------------------------------------------------------

def machine() -> str:
    model = "?"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    flags = ""
    with contextlib.suppress(OSError):
        flags = next((line for line in open("/proc/cpuinfo") if line.startswith("flags")), "")
    isa = ("AVX-512" + (" + VNNI" if "avx512_vnni" in flags else "") +
           (" + AVX512_BF16" if "avx512_bf16" in flags else " (no AVX512_BF16)")) if "avx512f" in flags else \
        ("AVX2" if "avx2" in flags else "no AVX2")
    return f"{model}, {isa}, {len(os.sched_getaffinity(0))} cores"


def print_agreement(outputs: dict[str, list[list[int]]], streams: int) -> None:
    """How far each stream's greedy tokens agree with the llaisys run of the same weights and adapters (a
    random bf16 model's near-ties part ways after a while: a check that the same adapters were applied)."""
    def common(x: list[int], y: list[int]) -> int:
        return next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))

    per = streams // len(ADAPTERS)
    pairs = [("llama.cpp base", "llaisys base"), ("llama.cpp (a) 1 server/adapter", "llaisys 4 adapters"),
             ("llama.cpp (b) 1 server, 4 adapters", "llaisys 4 adapters"), ("llaisys 4 adapters", "llaisys base")]
    lines = [f"{a} vs {b}: " + " ".join(str(common(x, y)) for x, y in zip(outputs[a], outputs[b]))
             for a, b in pairs if a in outputs and b in outputs]
    merged = outputs["llaisys merged"][:per], outputs["llaisys 4 adapters"][:per]  # adapter a both
    lines.append("llaisys merged vs llaisys 4 adapters, adapter a's streams: " +
                 " ".join(str(common(x, y)) for x, y in zip(*merged)))
    print("\nGreedy tokens in common from the first, per stream (of " +
          f"{len(outputs['llaisys base'][0])}):\n  " + "\n  ".join(lines))


def print_profile(profiles: dict[str, dict]) -> None:
    """Per op, the median over the decode steps of its time in a step (this machine's other work preempts a thread
    of the team now and then, for milliseconds: a mean would show where that fell, not the op's cost)."""
    def median_of(p: dict, pick) -> float:
        return float(np.median([sum(s for op, (s, _) in step.items() if pick(op)) for step in p["ops"]]))

    configs = list(profiles)
    names = sorted({op.split(" ")[0] for p in profiles.values() for step in p["ops"] for op in step})
    rows = [(name, [median_of(p, lambda op, name=name: op.split(" ")[0] == name) for p in profiles.values()])
            for name in names]
    rows.sort(key=lambda row: -max(row[1]))
    steps = [float(np.median(p["step_seconds"])) for p in profiles.values()]
    rows.append(("(outside ops: host, Python)", [st - median_of(p, lambda op: True)
                                                 for p, st in zip(profiles.values(), steps)]))
    rows.append(("step", steps))
    n = min(p["steps"] for p in profiles.values())
    print(f"\nDecode steps, eager and profiled: ms per step, medians over {n} steps")
    print(f"{'op':28}" + "".join(f"{c:>22}" for c in configs))
    for op, values in rows:
        if max(values) >= 5e-5 or op == "step":  # (0.05 ms a step or more)
            print(f"{op:28}" + "".join(f"{1e3 * v:22.2f}" for v in values))
    if len(configs) != 2:
        return
    base, lora = (profiles[c] for c in configs)
    lora_ops = median_of(lora, lambda op: op.startswith("lora_"))
    print(f"LoRA ops: {1e3 * lora_ops:.2f} ms of a {1e3 * steps[1]:.2f} ms step ({lora_ops / steps[1]:.1%}); the "
          f"step is {1e3 * (steps[1] - steps[0]):.2f} ms longer than the base's")
    print("LoRA ops by shape (the op's size arguments: M x K x R x S, M x R x N x S), per decode step:")
    shapes = sorted({op for step in lora["ops"] for op in step if op.startswith("lora_")})
    for op in shapes:
        calls = float(np.median([step[op][1] for step in lora["ops"] if op in step]))
        seconds = median_of(lora, lambda o, op=op: o == op)
        print(f"  {op:32}{calls:6.0f} calls{1e6 * seconds / calls:10.1f} us/call{1e3 * seconds:10.2f} ms")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/tmp/lora-bench"), help="where the files are written (kept)")
    ap.add_argument("--layers", type=int, default=SHAPE["num_hidden_layers"])
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="llama-server's -t")
    ap.add_argument("--llama-server", help="llama.cpp's llama-server (none: llaisys only)")
    ap.add_argument("--llama-type", default="BF16", choices=["BF16", "F16", "Q8_0"],
                    help="the GGUF model's tensor type (BF16: the same weights)")
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args(argv)
    if args.streams % len(ADAPTERS):
        ap.error(f"--streams must be a multiple of {len(ADAPTERS)}")

    t0 = time.perf_counter()
    paths = prepare(args)
    print(f"files ready in {args.out} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    shape_vocab = SHAPE["vocab_size"]
    batch = prompts(args, shape_vocab)
    engine = Llaisys(paths)
    ours = list(engine.configs(args.streams))
    theirs = ["llama.cpp base", "llama.cpp (a) 1 server/adapter", "llama.cpp (b) 1 server, 4 adapters"] \
        if args.llama_server else []
    for config in ours:  # warm-up: each step shape captured once
        engine.run(config, batch, 4)

    results: dict[str, list[float]] = {c: [] for c in ours + theirs}
    outputs: dict[str, list[list[int]]] = {}
    for r in range(args.rounds):
        order = ours + theirs if r % 2 == 0 else theirs + ours[::-1]
        for config in order:
            print(f"  round {r + 1}: {config}...", file=sys.stderr, flush=True)
            rate, outputs[config] = engine.run(config, batch, args.new_tokens) if config in ours else \
                llama_run(args, paths, config, batch)
            results[config].append(rate)
            print(f"    {rate:.2f} tok/s", file=sys.stderr, flush=True)

    print(f"\n{machine()}; load average {os.getloadavg()[0]:.1f}; model {paths['model']} "
          f"({args.layers} layers, bf16); {args.streams} streams x ({args.prompt_tokens} prompt + "
          f"{args.new_tokens} new tokens); llama.cpp GGUF {args.llama_type}, adapters BF16; {args.rounds} rounds")
    base = results["llaisys base"]
    header = f"{'config':38}{'decode tok/s':>14}{'vs llaisys base':>17}   per round (tok/s; ratio)"
    print(header + "\n" + "-" * len(header))
    ratios = {}
    for config, rates in results.items():
        ratios[config] = [x / b for x, b in zip(rates, base)]
        rounds = ", ".join(f"{x:.1f} ({q:.2f})" for x, q in zip(rates, ratios[config]))
        print(f"{config:38}{np.median(rates):14.2f}{np.median(ratios[config]):16.2f}x   {rounds}")
    mixed, merged = np.median(ratios["llaisys 4 adapters"]), np.median(ratios["llaisys merged"])
    print(f"targets: 4 adapters >= 0.8x base: {mixed:.2f}x ({'met' if mixed >= 0.8 else 'NOT met'}); "
          f"merged == base: {merged:.2f}x")

    print_agreement(outputs, args.streams)
    if not args.no_profile:
        print_profile(engine.profile(batch, min(args.new_tokens, 32)))
    print(f"\n({time.perf_counter() - t0:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
