"""The scheduler's own cost per step (everything a step does besides the forward), and the decode rate.

    python benchmarks/scheduler_step.py                                   # this tree
    python benchmarks/scheduler_step.py --src /work/before/llaisys-models/src   # before / after, alternating
    ... [--model DIR] [--device cpu] [--streams 1,8] [--prompt 12] [--new 32] [--runs 25] [--rounds 5]

Each measurement runs in a child process whose ``sys.path`` starts with the tree it measures (``--src``: the
other tree; this one's otherwise), using only public API (``llaisys_models.load``, ``model.generate`` for one
stream, ``model.generate_batch`` for several), so it measures any version of the package. The model's
``forward_batch`` is wrapped with a clock:

    overhead   per decode step, the time from one forward's return to the next forward's call: sampling, the
               scheduler's bookkeeping (commit, schedule), the generation loop. The median over a run's
               decode steps; the best (lowest) of --runs runs
    stub       the same with a stub forward (appends the ids, returns logits of zeros): the whole step without
               the model's compute (the host-side step inputs included), median per step, best of --runs
    decode     decode tokens/s (all streams) with the real forward, best of --runs

Rounds alternate the trees (before, after, before, ...), --runs split over them, so both see the same machine
load; the table gives each tree's best and the ratio after / before. Without --model it uses the embedded
demo model (4 layers, hidden 128: a forward of a few hundred microseconds on the CPU, so the scheduler's share
of a step is as large as it gets).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
THIS_SRC = HERE.parent / "llaisys-models" / "src"


# -- the child: measurements of one tree ------------------------------------------------------------------------

class Clock:
    """Wraps ``model.forward_batch``: the call and return time of each decode forward (one new token each)."""

    def __init__(self, model: Any, stub: bool) -> None:
        self.model, self.stub = model, stub
        self.real = model.forward_batch
        self.calls: list[tuple[float, float, bool]] = []  # (called, returned, decode step)
        self._zeros: dict[int, Any] = {}
        model.forward_batch = self.forward_batch

    def forward_batch(self, pool: Any, batch: list, logits_of: Any = None) -> Any:
        decode = all(len(ids) == 1 for _, ids in batch)
        called = time.perf_counter()
        logits = self._stub(batch, logits_of) if self.stub else self.real(pool, batch, logits_of)
        self.calls.append((called, time.perf_counter(), decode))
        return logits

    def _stub(self, batch: list, logits_of: Any) -> Any:
        import llaisys

        rows = sum(logits_of) if logits_of is not None else sum(len(ids) for _, ids in batch)
        if rows not in self._zeros:
            m = self.model
            self._zeros[rows] = llaisys.zeros((rows, m.config.vocab_size), m.dtype, m.device)
        for seq, ids in batch:
            seq.commit(ids)
        return self._zeros[rows]

    def reset(self) -> None:
        self.calls.clear()

    def overhead(self) -> float:
        """Median seconds from a decode forward's return to the next decode forward's call."""
        gaps = [b[0] - a[1] for a, b in zip(self.calls, self.calls[1:]) if a[2] and b[2]]
        return statistics.median(gaps)

    def step(self) -> float:
        """Median seconds from one decode forward's call to the next (a whole step)."""
        periods = [b[0] - a[0] for a, b in zip(self.calls, self.calls[1:]) if a[2] and b[2]]
        return statistics.median(periods)

    def decode_rate(self, streams: int) -> float:
        decode = [c for c in self.calls if c[2]]
        return streams * (len(decode) - 1) / (decode[-1][1] - decode[1][0]) if len(decode) > 2 else 0.0


def generate(model: Any, prompts: list[list[int]], new: int) -> None:
    """One stream: ``model.generate`` (the model's own scheduler); several: ``model.generate_batch``."""
    if len(prompts) == 1:
        model.generate(prompts[0], new, eos_token_ids=())
    else:
        model.generate_batch(prompts, new, eos_token_ids=())


def child(args: argparse.Namespace) -> None:
    if args.src:
        sys.path.insert(0, args.src)
    import llaisys_models

    if args.src and not Path(llaisys_models.__file__).resolve().is_relative_to(Path(args.src).resolve()):
        raise SystemExit(f"llaisys_models came from {llaisys_models.__file__}, not {args.src}")
    model = llaisys_models.load(args.model or llaisys_models.DEMO_MODEL_DIR, device=args.device)
    vocab = model.config.vocab_size
    out: dict[str, Any] = {"source": str(Path(llaisys_models.__file__).parent)}
    for streams in args.streams:
        prompts = [[(7 * s + 3 * i) % vocab for i in range(args.prompt + s)] for s in range(streams)]
        for stub in (False, True):
            clock = Clock(model, stub)
            generate(model, prompts, args.new)  # warm-up: decode graphs captured, buffers made
            overheads, steps, rates = [], [], []
            for _ in range(args.runs):
                clock.reset()
                generate(model, prompts, args.new)
                overheads.append(clock.overhead())
                steps.append(clock.step())
                rates.append(clock.decode_rate(streams))
            model.forward_batch = clock.real
            if stub:
                out[f"{streams}:stub"] = steps
            else:
                out[f"{streams}:overhead"] = overheads
                out[f"{streams}:decode"] = rates
    print(json.dumps(out))


# -- the parent: alternating rounds, the table ------------------------------------------------------------------

def run_child(args: argparse.Namespace, src: str | None, runs: int) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", "--runs", str(runs), "--device", args.device,
               "--streams", ",".join(map(str, args.streams)), "--prompt", str(args.prompt), "--new", str(args.new),
               "--src", src or str(THIS_SRC)]
    if args.model:
        command += ["--model", args.model]
    proc = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy())
    if proc.returncode:
        raise SystemExit(f"the child for {src or 'this tree'} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", default=None, help="another tree's llaisys-models/src to compare against (before)")
    parser.add_argument("--model", default=None, help="model directory (default: the embedded demo model)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--streams", default="1,8", type=lambda s: [int(v) for v in s.split(",")])
    parser.add_argument("--prompt", type=int, default=12, help="prompt tokens (stream i: this + i)")
    parser.add_argument("--new", type=int, default=32, help="new tokens per stream and run")
    parser.add_argument("--runs", type=int, default=25, help="runs per tree (best of these)")
    parser.add_argument("--rounds", type=int, default=5, help="alternations of the trees (runs split over them)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    trees = {"before": args.src, "after": None} if args.src else {"this": None}
    per_round = -(-args.runs // args.rounds)
    results: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    sources = {}
    for _ in range(args.rounds):
        for name, src in trees.items():
            got = run_child(args, src, per_round)
            sources[name] = got.pop("source")
            for key, values in got.items():
                results[name].setdefault(key, []).extend(values)
    for name, source in sources.items():
        print(f"{name:>7}: {source}")
    print(f"{args.model or 'demo model'} on {args.device}: prompt {args.prompt}+, {args.new} new tokens a stream, "
          f"best of {per_round * args.rounds} runs, {args.rounds} rounds alternating; load {os.getloadavg()[0]:.2f}")
    names = list(trees)
    print(f"{'':<36}" + "".join(f"{name:>10}" for name in names) + ("     ratio" if len(names) == 2 else ""))
    for streams in args.streams:
        for key, label, scale, best in (("overhead", "overhead / step (us)", 1e6, min),
                                        ("stub", "step, stub forward (us)", 1e6, min),
                                        ("decode", "decode (tok/s)", 1.0, max)):
            values = [best(results[name][f"{streams}:{key}"]) * scale for name in names]
            row = f"{streams:>2} stream{'s' if streams > 1 else ' '} {label:<26}" + "".join(f"{v:>10.1f}" for v in values)
            if len(values) == 2:
                row += f"{values[1] / values[0]:>9.3f}x"
            print(row)


if __name__ == "__main__":
    main()
