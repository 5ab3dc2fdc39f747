#!/usr/bin/env python
"""Where HF transformers' Qwen2 forward rounds in bf16 / f16 on the CPU, each claim checked bit for bit.

    python tools/hf_rounding.py            # about half a minute on one core; needs torch + transformers
    python tools/hf_rounding.py --models   # also: how often HF eager and HF sdpa (the default) disagree

For every step of the forward pass, HF's own code (the transformers modules, torch's kernels)
runs on random inputs in the model dtype and its output is compared with emulations written
here in float32 / float64 with explicit roundings (``R`` = round to the model dtype, RNE):
"HF" is the rounding sequence claimed for HF, "once" the same math rounded only at the end
(what llaisys' exact numerics do). A column shows the fraction of output elements that are
bit-identical; the claim holds when "HF" is 1.0000 (or, where torch uses an approximate
transcendental, nearly so, with the reason given). This is the evidence for the
``numerics="hf"`` kernels and the specification their op tests follow.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import tempfile
import types
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import Qwen2Config
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.qwen2 import modeling_qwen2 as qwen2

KV_BLOCK = 512  # keys per block of torch's CPU flash attention (its kv split size)


def equal(a: torch.Tensor, b: torch.Tensor) -> str:
    """Fraction of bit-identical elements; where not all are, the largest difference in ulps of b
    (elements below 1/64 of b's largest magnitude are measured in ulps of that 1/64, so that
    cancellation to near zero does not read as thousands of ulps)."""
    same = (a == b).float().mean().item()
    if same == 1.0:
        return "1.0000"
    magnitude = b.float().abs().clamp_min(b.float().abs().max().item() / 64).clamp_min(torch.finfo(b.dtype).tiny)
    ulp = torch.ldexp(torch.full_like(magnitude, torch.finfo(b.dtype).eps), torch.frexp(magnitude)[1] - 1)
    return f"{same:.4f} ({((a.float() - b.float()).abs() / ulp).max().item():.2g} ulp)"


def show(claim: str, **fractions: str) -> None:
    print(f"  {claim:58s} " + "  ".join(f"{k}={v}" for k, v in fractions.items()))


def check_linear(R) -> None:
    print("linear with bias (nn.Linear -> addmm): x W^T accumulated in f32, + bias, ONE rounding")
    for m, k in ((1, 128), (7, 128), (64, 1536), (1, 1536)):
        x, w, b = R(torch.randn(m, k)), R(torch.randn(256, k) / math.sqrt(k)), R(torch.randn(256) * 3)
        exact = x.double() @ w.double().T
        show(f"M={m} K={k}", HF=equal(F.linear(x, w, b), R(exact + b.double())),
             two_roundings=equal(F.linear(x, w, b), R(R(exact).double() + b.double())))


def check_rms_norm(R, dtype) -> None:
    print("RMSNorm: normalised in f32, rounded, times the weight, rounded again")
    norm = qwen2.Qwen2RMSNorm(1536, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(1536) + 0.5)
    norm = norm.to(dtype)
    x = R(torch.randn(16, 1536) * 3)
    h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    w = norm.weight.float()
    show("weight * R(x * rsqrt(mean(x^2) + eps))", HF=equal(norm(x), R(w * R(h).float())), once=equal(norm(x), R(w * h)))


def check_rope(R, dtype) -> None:
    print("RoPE: inv_freq and angle in f32, cos/sin rounded, each product rounded, the sum rounded")
    d, theta = 128, 1e6
    config = Qwen2Config(hidden_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=d,
                         rope_parameters={"rope_type": "default", "rope_theta": theta})
    rotary = qwen2.Qwen2RotaryEmbedding(config)
    pos = torch.tensor([[0, 1, 2, 17, 255, 1000, 4097, 32767, 100000]])
    x = R(torch.randn(1, 4, pos.shape[1], d))
    cos, sin = rotary(x, pos)
    out, _ = qwen2.apply_rotary_pos_emb(x, x, cos, sin)

    exponent = (torch.arange(0, d, 2, dtype=torch.float32) / d).double()  # f32 (2j) / d
    inv_freq = (1.0 / torch.pow(theta, exponent).float())  # pow in f64, rounded; 1/x in f32
    show("inv_freq == f32(1 / f32(theta^f32(2j/d)))", HF=equal(rotary.inv_freq, inv_freq))
    angle = pos[0].float()[:, None] * inv_freq  # f32 product
    angle = torch.cat((angle, angle), -1)
    exact_angle = pos[0].double()[:, None] / theta ** (torch.arange(0, d, 2).double() / d)
    exact_angle = torch.cat((exact_angle, exact_angle), -1)
    table = torch.stack((cos[0], sin[0]))
    show("cos/sin == R(f32(cos(f32 angle)))", HF=equal(table, R(torch.stack((angle.double().cos(),
                                                                               angle.double().sin())).float())),
         exact_angle=equal(table, R(torch.stack((exact_angle.cos(), exact_angle.sin())))))
    c, s, rot = cos[:, None].float(), sin[:, None].float(), qwen2.rotate_half(x).float()
    show("x*cos + rotate_half(x)*sin", HF=equal(out, R(R(x.float() * c).float() + R(rot * s).float())),
         once=equal(out, R(x.float() * c + rot * s)))


def check_swiglu(R) -> None:
    print("SwiGLU: silu(gate) in f32, rounded; times up, rounded")
    gate, up = R(torch.randn(64, 1024) * 3), R(torch.randn(64, 1024) * 3)
    silu = gate.double() / (1 + torch.exp(-gate.double()))
    out = F.silu(gate) * up
    show("silu(gate) * up", HF=equal(out, R(R(silu).double() * up.double())), once=equal(out, R(silu * up.double())))


def check_residual(R) -> None:
    print("residual add: one rounding")
    a, b = R(torch.randn(4096) * 10), R(torch.randn(4096))
    show("a + b", HF=equal(a + b, R(a.double() + b.double())))


def attention_inputs(R, L, S, H=4, Hkv=2, d=64):
    module = types.SimpleNamespace(num_key_value_groups=H // Hkv, training=False, is_causal=True)
    q, k, v = R(torch.randn(1, H, L, d) * 2), R(torch.randn(1, Hkv, S, d) * 2), R(torch.randn(1, Hkv, S, d))
    keys, values = qwen2.repeat_kv(k, H // Hkv).float(), qwen2.repeat_kv(v, H // Hkv).float()
    mask = torch.where(torch.arange(S)[None] <= torch.arange(L)[:, None] + S - L, 0.0, float("-inf"))
    return module, q, k, v, keys, values, mask, d ** -0.5


def check_eager_attention(R, dtype) -> None:
    print("eager attention: q k^T rounded, * scale rounded, + mask, softmax in f32 rounded, P V rounded")
    for L, S in ((1, 37), (1, 300), (9, 9), (64, 64)):
        module, q, k, v, keys, values, mask, scale = attention_inputs(R, L, S)
        hf_mask = R(mask.clamp_min(torch.finfo(dtype).min))[None, None]  # HF's additive mask in the model dtype
        out, _ = qwen2.eager_attention_forward(module, q, k, v, hf_mask if L > 1 else None, scaling=scale)
        scores = R(R(R(q.float() @ keys.transpose(2, 3)).float() * scale).float() + hf_mask.float())
        hf = R(R(torch.softmax(scores.float(), -1)).float() @ values).transpose(1, 2)
        once = R(torch.softmax(q.float() @ keys.transpose(2, 3) * scale + mask, -1) @ values).transpose(1, 2)
        show(f"L={L} S={S}", HF=equal(out, hf), once=equal(out, once))


def check_sdpa_attention(R) -> None:
    print("sdpa attention (HF's default; torch's CPU flash kernel): f32 scores and softmax, exp(s - running max)")
    print("  ROUNDED (unnormalised) before P V, running max over 512-key blocks, f32 sums, out = acc * (1/sum)")
    print("  rounded once. Keys in whole 16-float vectors use torch's exp_u20 (~20 bits), the rest std::exp:")
    print("  with fewer than 16 keys the emulation is exact; beyond, exp_u20 flips an output's last bit at times")
    for L, S in ((1, 5), (1, 15), (7, 15), (12, 12), (1, 37), (1, 300), (1, 1000), (40, 40)):
        module, q, k, v, keys, values, mask, scale = attention_inputs(R, L, S)
        # as HF calls it: no mask (is_causal) when the queries start at key 0, else a boolean mask
        hf_mask = None if L in (1, S) else (mask == 0)[None, None]
        out, _ = sdpa_attention_forward(module, q, k, v, hf_mask, scaling=scale)
        scores = q.float() @ keys.transpose(2, 3) * scale + mask
        acc = torch.zeros(*scores.shape[:-1], values.shape[-1])
        top = torch.full((*scores.shape[:-1], 1), float("-inf"))
        total = torch.zeros_like(top)
        for n in range(0, S, KV_BLOCK):
            block = scores[..., n:n + KV_BLOCK]
            new_top = torch.maximum(top, block.amax(-1, keepdim=True))
            p, rescale = torch.exp(block - new_top), torch.exp(top - new_top)
            total = p.sum(-1, keepdim=True) + rescale * total
            acc = acc * rescale + R(p).float() @ values[..., n:n + KV_BLOCK, :]
            top = new_top
        hf = R(acc * (1 / total)).transpose(1, 2)
        once = R(torch.softmax(scores, -1) @ values).transpose(1, 2)
        show(f"L={L} S={S}", HF=equal(out, hf), once=equal(out, once))


def check_transcendentals(R) -> None:
    print("torch's f32 cos/sin/exp are not correctly rounded, but after rounding to the model dtype they agree")
    a = torch.rand(1_000_000) * 1000
    x = torch.randn(1_000_000) * 4
    show("f32 cos / exp == correctly rounded f32", cos=equal(a.cos(), a.double().cos().float()),
         exp=equal(x.exp(), x.double().exp().float()))
    show("R(f32 cos) / R(f32 silu) == R(correctly rounded)", cos=equal(R(a.cos()), R(a.double().cos())),
         silu=equal(F.silu(R(x)), R(R(x).double() / (1 + torch.exp(-R(x).double())))))


def check_eager_vs_sdpa(prompts: int = 12, new_tokens: int = 128) -> None:
    """Greedy steps where HF eager's argmax differs from HF sdpa's (the default), along sdpa's greedy
    sequences, on the tiny test checkpoints; and each one's largest |logit - exact| (float64)."""
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "models"))
    from tiny_models import SPECS, make_checkpoint

    print(f"\nHF eager vs HF sdpa: argmax along sdpa's greedy sequences ({prompts} prompts x {new_tokens} tokens)")
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("bf16_mha_hd64", "bf16_gqa4_hd128_sharded", "f16_gqa3_hd64_legacy"):
            path = Path(tmp) / name
            path.mkdir()
            make_checkpoint(path, SPECS[name])
            dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[SPECS[name].dtype]
            sdpa = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
            eager = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager").eval()
            exact = copy.deepcopy(sdpa).to(torch.float64)
            differ = steps = 0
            err_sdpa = err_eager = 0.0
            for i in range(prompts):
                x = torch.randint(0, 256, (1, 1 + 5 * i), generator=torch.Generator().manual_seed(i))
                with torch.no_grad():
                    seq = sdpa.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                                        do_sample=False, pad_token_id=0, eos_token_id=None)[:, :-1]
                    start = x.shape[1] - 1
                    a, b = sdpa(seq).logits[0, start:].float(), eager(seq).logits[0, start:].float()
                    e = exact(seq).logits[0, start:]
                differ += int((a.argmax(-1) != b.argmax(-1)).sum())
                steps += a.shape[0]
                err_sdpa = max(err_sdpa, (a.double() - e).abs().max().item())
                err_eager = max(err_eager, (b.double() - e).abs().max().item())
            show(name, argmax_differs=f"{differ}/{steps}", sdpa_err=f"{err_sdpa:.3g}", eager_err=f"{err_eager:.3g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", action="store_true", help="also compare HF eager and sdpa on tiny models")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}")
    for dtype in (torch.bfloat16, torch.float16):
        print(f"\n==== {dtype} ====")

        def R(t, dtype=dtype):
            return t.to(dtype)

        check_linear(R)
        check_rms_norm(R, dtype)
        check_rope(R, dtype)
        check_swiglu(R)
        check_residual(R)
        check_eager_attention(R, dtype)
        check_sdpa_attention(R)
        check_transcendentals(R)
    if args.models:
        from transformers.utils import logging

        logging.disable_progress_bar()
        logging.set_verbosity_error()
        check_eager_vs_sdpa()


if __name__ == "__main__":
    main()
