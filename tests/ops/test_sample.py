"""sample: temperature, top-k, nucleus top-p and a seeded draw, checked against torch's softmax.

The draw depends only on the seed, so every test here is deterministic; the goodness-of-fit tests
use a generous p-value threshold (1e-4) so that a correct kernel passes for any seeds.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import llaisys
from helpers import FLOAT_DTYPES, TORCH_DTYPES, from_torch, to_torch
from helpers.references.sample import reference_token
from helpers.simd_paths import LEVELS, run_under_simd, skip_unless_level_available

VOCAB = 151936
LOGITS8 = [1.0, 2.0, 0.5, -1.0, 3.0, 0.0, 2.5, -0.5]


def draw(logits, **kw) -> int:
    """One token drawn from ``logits``, into an int64 [1] on the logits' device, read back to the host (which
    also synchronizes: an asynchronous backend reports a kernel-detected error, NaN logits say, there)."""
    out = from_torch(torch.full((1,), -1, dtype=torch.int64), logits.device)
    llaisys.ops.sample(out, logits, **kw)
    return int(to_torch(out)[0])


def as_logits(values, dtype, device="cpu"):
    return from_torch(torch.as_tensor(values, dtype=torch.float32).to(TORCH_DTYPES[dtype]), device)


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """P(chi2 >= statistic) for observed counts against expected probabilities (cells with p > 0)."""
    keep = probs > 0
    assert counts[~keep].sum() == 0, f"drew tokens of probability 0: {counts.tolist()}"
    expected = probs[keep] * counts.sum()
    stat = ((counts[keep] - expected) ** 2 / expected).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def restricted_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """softmax(logits / T) restricted to top-k then top-p (float64 reference), renormalised."""
    order = sorted(range(len(logits)), key=lambda i: (-float(logits[i]), i))
    probs = torch.softmax(logits.to(torch.float64) / temperature, 0)
    keep = order[:top_k] if top_k else order
    mass = probs[keep] / probs[keep].sum()
    cum, nucleus = 0.0, []
    for i, p in zip(keep, mass.tolist()):
        nucleus.append(i)
        cum += p
        if cum >= top_p:
            break
    out = torch.zeros_like(probs)
    out[nucleus] = probs[nucleus] / probs[nucleus].sum()
    return out


def check_distribution(dtype, temperature, top_k, top_p, device="cpu", seeds=4000):
    values = torch.tensor(LOGITS8).to(TORCH_DTYPES[dtype])
    logits = from_torch(values, device)
    counts = torch.zeros(8, dtype=torch.float64)
    for seed in range(seeds):
        counts[draw(logits, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)] += 1
    probs = restricted_probs(values.to(torch.float64), temperature, top_k, top_p)
    p_value = chi_square_p_value(counts, probs)
    assert p_value > 1e-4, f"{dtype.name} T={temperature} k={top_k} p={top_p}: counts {counts.tolist()} " \
                           f"vs expected {(probs * seeds).tolist()}, chi-square p-value {p_value:.2g}"


def check_masks(dtype, device="cpu", seeds=40):
    """On the Qwen2 vocabulary: never a token outside the top k or the nucleus."""
    g = torch.Generator().manual_seed(1)
    values = (torch.randn(VOCAB, generator=g) * 4).to(TORCH_DTYPES[dtype])
    logits = from_torch(values, device)
    v64 = values.to(torch.float64)
    for k in (2, 50, 5000):
        topk = set(torch.topk(v64, k).indices.tolist())
        assert len(topk) == k
        for seed in range(seeds):
            assert draw(logits, temperature=1.3, top_k=k, seed=seed) in topk
    probs = torch.softmax(v64, 0)
    sorted_probs, order = torch.sort(probs, descending=True, stable=True)
    for top_p in (0.3, 0.9):
        # the nucleus plus a margin of 1e-6 of the mass (float rounding at its edge)
        size = int(torch.searchsorted(sorted_probs.cumsum(0), top_p + 1e-6)) + 1
        nucleus = set(order[:size].tolist())
        for seed in range(seeds):
            assert draw(logits, top_p=top_p, seed=seed) in nucleus
        for seed in range(seeds):  # top-k and top-p together
            token = draw(logits, top_k=50, top_p=top_p, seed=seed)
            assert token in nucleus and token in set(order[:50].tolist())


def check_all_paths():
    for dtype in FLOAT_DTYPES:
        check_distribution(dtype, 1.0, 0, 1.0, seeds=1500)
        check_distribution(dtype, 0.8, 5, 0.9, seeds=1500)
        check_masks(dtype, seeds=5)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (2.0, 0, 1.0), (1.0, 3, 1.0),
                                                     (1.0, 0, 0.6), (1.0, 5, 0.8), (1.5, 6, 0.95)])
def test_sample_distribution(device, dtype, temperature, top_k, top_p):
    check_distribution(dtype, temperature, top_k, top_p, device)


def test_chi_square_check_can_fail(device):
    """The goodness-of-fit check rejects a distribution at the wrong temperature."""
    logits = as_logits(LOGITS8, llaisys.float32, device)
    counts = torch.zeros(8, dtype=torch.float64)
    for seed in range(4000):
        counts[draw(logits, temperature=1.0, seed=seed)] += 1
    wrong = restricted_probs(torch.tensor(LOGITS8, dtype=torch.float64), 1.3, 0, 1.0)
    assert chi_square_p_value(counts, wrong) < 1e-4


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_sample_masks_on_qwen2_vocab(device, dtype):
    check_masks(dtype, device)


@pytest.mark.parametrize("top_k", [6, 2000])  # the heap path and the radix-selection path
def test_sample_top_k_ties_keep_lowest_indices(device, top_k):
    """Equal logits at the k-th place: the lowest indices stay (as argmax's first-index rule)."""
    values = torch.zeros(5000)
    values[1::7] = -0.0
    values[[5, 500, 900, 4999]] = 2.0  # four above, then 4996 tied at 0 (some of them -0.0)
    logits = from_torch(values, device)
    allowed = {5, 500, 900, 4999} | set([i for i in range(5000) if i not in (5, 500, 900, 4999)][: top_k - 4])
    seen = {draw(logits, top_k=top_k, temperature=50.0, seed=s) for s in range(400)}
    assert seen <= allowed, sorted(seen - allowed)[:5]
    assert len(seen - {5, 500, 900, 4999}) > 1, "the tied tokens should be drawn sometimes at temperature 50"


@pytest.mark.parametrize("top_k,peak,deep", [(0, 10.0, True), (10000, 5.0, True), (50, 5.0, False)])
def test_sample_nucleus_far_below_the_top_token(device, top_k, peak, deep):
    """One top token and a long flat tail: the nucleus may reach deep into the tail (ties by index).

    top_k=0, peak 10: p(777) ~ 0.13, each tail token 4.5e-5 of the top one (the kernel's probability
    threshold has to come down); top_k=10000, peak 5: p(777) ~ 0.015 within the top k; top_k=50: 0.75.
    """
    values = torch.zeros(VOCAB)
    values[777] = peak
    logits = from_torch(values, device)
    probs = torch.softmax(values.to(torch.float64), 0)
    k = top_k or VOCAB
    order = [777] + [i for i in range(VOCAB) if i != 777][: k - 1]
    mass = probs[order] / probs[order].sum()
    size = int(torch.searchsorted(mass.cumsum(0), 0.5)) + 1
    allowed = set(order[:size])
    tokens = [draw(logits, top_k=top_k, top_p=0.5, seed=s) for s in range(60)]
    assert all(t in allowed for t in tokens), sorted(set(tokens) - allowed)[:5]
    assert (size > 1000) == deep
    if deep:
        assert max(tokens) > 1000, "the tail should be drawn"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_sample_is_deterministic_per_seed(device, dtype):
    g = torch.Generator().manual_seed(2)
    logits = from_torch((torch.randn(VOCAB, generator=g) * 2).to(TORCH_DTYPES[dtype]), device)
    for kw in (dict(), dict(top_k=40, top_p=0.9, temperature=0.8), dict(top_p=0.95)):
        first = [draw(logits, seed=s, **kw) for s in range(8)]
        again = [draw(logits, seed=s, **kw) for s in range(8)]
        assert first == again, kw
        assert len(set(first)) > 1, f"8 seeds gave one token {first} ({kw})"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_sample_a_seed_picks_the_documented_token(device, dtype):
    """A seed repeats exactly on every device: each backend draws the token the contract defines (here a
    float64 reading of it), for every kind of draw, top-k alone included (candidates by logit, not in the
    order a heap or a selection left them)."""
    g = torch.Generator().manual_seed(3)
    values = (torch.randn(2500, generator=g) * 2).to(TORCH_DTYPES[dtype])
    logits = from_torch(values, device)
    for t, k, p in [(1.0, 0, 1.0), (0.7, 40, 1.0), (1.1, 1500, 1.0), (0.8, 0, 0.9), (1.0, 50, 0.95)]:
        got = [draw(logits, temperature=t, top_k=k, top_p=p, seed=s) for s in range(5)]
        want = [reference_token(values, t, k, p, s) for s in range(5)]
        assert got == want, f"T={t} k={k} p={p}"


def test_sample_different_seeds_differ(device):
    logits = as_logits([0.0] * 8, llaisys.float32, device)
    tokens = [draw(logits, seed=s) for s in range(200)]
    assert set(tokens) == set(range(8)), "200 seeds over 8 equal logits should reach every token"
    assert draw(logits, seed=(1 << 64) - 1) in range(8)
    runs = sum(a == b for a, b in zip(tokens, tokens[1:]))
    assert runs < 60, "consecutive seeds look correlated"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=lambda d: d.name)
def test_sample_greedy_is_argmax(device, dtype):
    g = torch.Generator().manual_seed(3)
    for n in (1, 3, 17, 4097, VOCAB):
        values = torch.randn(n, generator=g).to(TORCH_DTYPES[dtype])
        values[n // 2] = values[n - 1] = 9.0  # tie: the first wins
        logits = from_torch(values, device)
        want = int(torch.argmax(values))
        assert want == n // 2
        for seed in (0, 1, 12345):
            assert draw(logits, temperature=0.0, seed=seed) == want
            assert draw(logits, temperature=0.9, top_k=1, top_p=0.5, seed=seed) == want
            assert draw(logits, temperature=1e-300, seed=seed) == want
            assert draw(logits, top_p=1e-9, seed=seed) == want  # the nucleus always keeps one token


def test_sample_infinite_logits(device):
    values = torch.tensor([0.0, float("inf"), 3.0, float("inf"), float("-inf")])
    logits = from_torch(values, device)
    tokens = {draw(logits, seed=s) for s in range(100)}
    assert tokens == {1, 3}
    values = torch.tensor([float("-inf"), 1.0, float("-inf")])
    assert {draw(from_torch(values, device), seed=s) for s in range(20)} == {1}
    # a huge temperature flattens the finite logits and still never draws -inf
    values = torch.tensor([0.0, 1.0, float("-inf"), 2.0])
    assert {draw(from_torch(values, device), temperature=1e300, seed=s) for s in range(200)} == {0, 1, 3}


def thread_count_tokens():
    g = torch.Generator().manual_seed(5)
    logits = from_torch(torch.randn(VOCAB, generator=g) * 0.5, "cpu")  # big enough for the parallel exp pass
    return [draw(logits, seed=s) for s in range(30)] + [draw(logits, top_p=0.9, seed=s) for s in range(10)]


def test_sample_thread_count_does_not_change_tokens(device):
    if device.type != "cpu":
        pytest.skip("OpenMP threads belong to the CPU backend")
    here = Path(__file__).parent
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(here), str(here.parent), os.environ.get("PYTHONPATH", "")])}
    code = "import test_sample as t; print(t.thread_count_tokens())"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == str(thread_count_tokens()), "one thread and the default count disagree"


@pytest.mark.parametrize("level", LEVELS)
def test_sample_on_every_simd_path(device, level):
    skip_unless_level_available(device, level)
    run_under_simd(__name__, level, "t.check_all_paths()")


def test_sample_rejects_bad_logits(device):
    with pytest.raises(ValueError, match=r"logits\[2\] is NaN"):
        draw(as_logits([0.0, 1.0, float("nan"), 2.0], llaisys.float32, device), seed=0)
    with pytest.raises(ValueError, match=r"every logit is -inf"):
        draw(as_logits([float("-inf")] * 3, llaisys.bfloat16, device), seed=0)


def test_sample_rejects_bad_arguments(device):
    logits = as_logits(LOGITS8, llaisys.float32, device)
    out = llaisys.empty((1,), llaisys.int64, device)
    for kw, name in [(dict(temperature=-0.5), "temperature"), (dict(temperature=float("nan")), "temperature"),
                     (dict(top_k=-1), "top_k"), (dict(top_k=2.5), "top_k"), (dict(top_p=0.0), "top_p"),
                     (dict(top_p=1.5), "top_p"), (dict(seed=-1), "seed"), (dict(seed=1 << 64), "seed")]:
        with pytest.raises(ValueError, match=rf"\b{name}\b"):
            llaisys.ops.sample(out, logits, **kw)
    with pytest.raises(ValueError, match=r"\blogits\b.*1-d"):
        llaisys.ops.sample(out, llaisys.empty((2, 4), llaisys.float32, device))
    with pytest.raises(ValueError, match=r"\blogits\b.*empty"):
        llaisys.ops.sample(out, llaisys.empty((0,), llaisys.float32, device))
    with pytest.raises(ValueError, match=r"\bout_idx\b.*dtype int32"):
        llaisys.ops.sample(llaisys.empty((1,), llaisys.int32, device), logits)
    with pytest.raises(ValueError, match=r"\blogits\b.*dtype int64"):
        llaisys.ops.sample(out, llaisys.empty((8,), llaisys.int64, device))
