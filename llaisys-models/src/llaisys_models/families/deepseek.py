"""DeepSeek-V2 / V3 (deepseek_v2.py, deepseek_v3.py declare them): multi-head latent attention and DeepSeekMoE.

Latent attention (MLA). Per token, one latent c (kv_lora_rank = dc values) and one rope key r (dr values) stand
for every head's keys and values; per head h, W_uk[h] [dn, dc] and W_uv[h] [dv, dc] are kv_b_proj's rows:

    q = (rms_norm(h Wqa) Wqb  or  h Wq)  per head: q_nope [dn], q_pe [dr]
    c = rms_norm(h Wkv_c);  r = rope(h Wkv_r)              cache[pos] = c, r       (dc + dr values, not heads x dims)
    score[h, j] = scale * (q_nope[h] . (W_uk[h] c[j]) + rope(q_pe[h]) . r[j])
                = scale * ((q_nope[h] W_uk[h]) . c[j] + rope(q_pe[h]) . r[j])           (W_uk absorbed into q)
    o[h] = (softmax_j(score[h]) @ c) W_uv[h]^T;  x += concat_h(o[h]) Wo

so a step reads each cached latent once for all heads (llaisys.ops.paged_latent_attention), prompt rows and
decode rows alike: one form, so a token's result never depends on how its prompt was cut or batched. The
per-head products with W_uk and W_uv are ``moe_linear`` with the heads as the experts (each head's matrix read
once for all rows). scale = (dn + dr)^-1/2, times mscale^2 with YaRN's mscale_all_dim. The rope dims are stored
in pairs (x0, x1), (x2, x3) ...: read as a strided view, they are rotated in the half-split layout ``rope``
takes, in q and r alike, which leaves every q . r unchanged.

DeepSeekMoE. The first ``first_k_dense_replace`` layers have a dense MLP; the others route each token to k of
E experts (ops.moe_router_grouped: V2 softmax scores, V3 sigmoid ones with a bias for the choice only, the
experts in groups of which only the best topk_group are eligible, weights times routed_scaling_factor), and add
the shared experts' MLP, which every token runs:

    x += sum_j w_j expert_{e_j}(h) + shared(h)
"""

from __future__ import annotations

import dataclasses
import threading
from importlib import import_module

import numpy as np

import llaisys

from ..engine.kv_cache import KVPool, KVShape, LayerKV
from ..engine.speculative.drafters import Drafter
from ..engine.step_inputs import StepInputs
from ..errors import ModelLoadError
from .causal_lm import Workspace
from .config import GroupedRouting, LatentAttention, flag, integer, number
from .deepseek_mtp import MTPDrafter, read_mtp
from .family import KERNELS, MOE_KERNELS, Experts
from .moe import SparseMlp, expert_counts
from .weights import LayerWeights, embedding, linear, moe_linear

# the kernels a DeepSeek forward calls beyond the decoder's (family.KERNELS, MOE_KERNELS)
DEEPSEEK_KERNELS = (*KERNELS, *MOE_KERNELS, "paged_latent_attention", "moe_router_grouped", "lora_shrink")

# A layer's weights as HF names them (after "model.layers.{i}."): attention, the dense MLP of the first layers,
# the shared experts of the others
TENSORS = {
    "input_norm": "input_layernorm.weight", "mlp_norm": "post_attention_layernorm.weight",
    "q_proj": "self_attn.q_proj.weight",  # (without q_lora_rank)
    "q_a_proj": "self_attn.q_a_proj.weight", "q_a_norm": "self_attn.q_a_layernorm.weight",
    "q_b_proj": "self_attn.q_b_proj.weight",
    "kv_a_norm": "self_attn.kv_a_layernorm.weight", "kv_b_proj": "self_attn.kv_b_proj.weight",
    "o_proj": "self_attn.o_proj.weight",
    "gate_proj": "mlp.gate_proj.weight", "up_proj": "mlp.up_proj.weight", "down_proj": "mlp.down_proj.weight",
    "shared_gate": "mlp.shared_experts.gate_proj.weight", "shared_up": "mlp.shared_experts.up_proj.weight",
    "shared_down": "mlp.shared_experts.down_proj.weight", "router_bias": "mlp.gate.e_score_correction_bias",
}
# kv_a_proj_with_mqa holds the latent's rows, then the rope key's
FUSED = {"self_attn.kv_a_proj_with_mqa.weight": ("kv_a_proj", "kv_rope_proj")}
EXPERTS = Experts(router="mlp.gate.weight", gate="mlp.experts.{}.gate_proj.weight",
                  up="mlp.experts.{}.up_proj.weight", down="mlp.experts.{}.down_proj.weight")


@dataclasses.dataclass(frozen=True)
class Absorbed:
    """One layer's per-head matrices of the absorbed form, derived from kv_b_proj at load: W_uk[h]^T [H, dc, dn]
    (q_nope -> the latent's space) and W_uv[h] [H, dv, dc] (the attended latent -> the head's values)."""
    uk_t: llaisys.Tensor
    uv: llaisys.Tensor


def absorbed(w: LayerWeights, m: LatentAttention, heads: int) -> Absorbed:
    """A layer's Absorbed matrices from its kv_b_proj [H x (dn + dv), dc] (kept in the model dtype by the loader)."""
    assert isinstance(w.kv_b_proj, llaisys.Tensor)  # (loading/weights.py: not a quantized linear)
    per_head = w.kv_b_proj.view(heads, m.qk_nope_head_dim + m.v_head_dim, m.kv_lora_rank)
    return Absorbed(per_head.slice(1, 0, m.qk_nope_head_dim).permute(0, 2, 1).contiguous(),
                    per_head.slice(1, m.qk_nope_head_dim, m.qk_nope_head_dim + m.v_head_dim).contiguous())


class DeepSeek(SparseMlp):
    """DeepSeek-V2 / V3: latent attention, and DeepSeekMoE after the first dense layers (module docstring)."""

    def _setup(self, *args, **kwargs) -> None:
        super()._setup(*args, **kwargs)
        self.absorbed = [absorbed(w, self.mla, self.config.num_attention_heads) for w in self.weights.layers]
        for w in self.weights.layers:  # (its absorbed matrices replace it: not kept twice)
            w.kv_b_proj = None
        self._one = llaisys.from_numpy(np.ones(1, np.float32), self.device)  # (the router product's scale)
        self._mtp_drafter: Drafter | None = None
        self._mtp_lock = threading.Lock()

    @property
    def mla(self) -> LatentAttention:
        assert self.config.mla is not None  # (deepseek_v2 / v3's config rules always set it)
        return self.config.mla

    def activations(self) -> dict[str, tuple]:
        c, m = self.config, self.mla
        heads, dn, dr, dc = c.num_attention_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.kv_lora_rank
        acts = {
            **super().activations(),
            "q_a": (max(m.q_lora_rank, 1),),
            "q": (heads, dn + dr),  # as q_b_proj (q_proj) gives it
            "q_nope": (heads, dn),
            "q_pe": (heads, dr),  # roped, half-split order
            "q_latent": (heads, dc + dr),  # q_nope W_uk, then q_pe: what attends over the latents
            "latent": (heads, dc),  # attention's output, before W_uv
            "attn": (heads, m.v_head_dim),
            "kv_c": (1, dc),
            "kv_rope": (1, dr),  # as kv_a_proj gives it (interleaved pairs), then roped in half-split order
            "k_pe": (1, dr),
            "head_ids": (llaisys.int64, heads),  # each row 0, 1, ..., H - 1: the heads as moe_linear's experts
            "router_logits": (llaisys.float32, c.num_experts),  # in f32, as DeepSeek's router computes them
            "router_slot": (llaisys.int64,),  # 0 in every row: the router's f32 product's one slot
        }
        if c.shared_expert_size:
            acts.update(shared_gate=(c.shared_expert_size,), shared_up=(c.shared_expert_size,),
                        shared_out=(c.hidden_size,))
        return acts

    @property
    def kv_shape(self) -> KVShape:
        m = self.mla
        return KVShape(self.config.num_hidden_layers, 1, m.kv_lora_rank, self.dtype, self.device,
                       self.kv_cache_dtype, value_dim=m.qk_rope_head_dim, latent=True)

    @property
    def attention_scale(self) -> float:
        """(dn + dr)^-1/2, times mscale^2 where YaRN's mscale_all_dim says (HF's yarn_apply_mscale)."""
        m, rope = self.mla, self.config.rope_scaling
        scale = (m.qk_nope_head_dim + m.qk_rope_head_dim) ** -0.5
        if rope.rope_type == "yarn" and rope.mscale_all_dim and rope.factor and rope.factor > 1:
            mscale = 0.1 * rope.mscale_all_dim * float(np.log(rope.factor)) + 1.0
            scale *= mscale * mscale
        return scale

    def fill_constants(self, ws: Workspace) -> None:
        """A new work buffer's constant rows: each row's head ids 0 .. H - 1 and its router slot 0."""
        rows, heads = ws.head_ids.shape
        ws.head_ids.load(np.ascontiguousarray(np.broadcast_to(np.arange(heads, dtype=np.int64), (rows, heads))))
        ws.router_slot.load(np.zeros(rows, np.int64))

    # -- multi-token prediction (deepseek_mtp.py) -------------------------------------------------------------

    def mtp_drafter(self) -> Drafter:
        """The drafter of this model's multi-token-prediction module (``speculative="mtp"``), its weights read
        from the checkpoint at the first call; a model whose checkpoint has none is refused."""
        with self._mtp_lock:
            if self._mtp_drafter is None:
                if self.config.num_nextn_predict_layers < 1:
                    raise llaisys.LlaisysValueError(f"{self.config.architecture} at {self.path} has no multi-token-"
                                                    f"prediction module (num_nextn_predict_layers = 0)")
                family = import_module(type(self).__module__).FAMILY
                self.mtp = read_mtp(self.checkpoint, self.config, family, self.dtype, self.device, self.quantize)
                self.mtp_absorbed = absorbed(self.mtp.model.layers[0], self.mla, self.config.num_attention_heads)
                self._mtp_drafter = MTPDrafter(self)
            return self._mtp_drafter

    def _router_logits(self, out: llaisys.Tensor, h: llaisys.Tensor, router: llaisys.Tensor,
                       slots: llaisys.Tensor) -> None:
        """out f32 [n, E] = h @ router^T summed in f32 and not rounded to the model dtype, as DeepSeek (and HF)
        compute the router: lora_shrink's product, with the router as the one slot's [E, hidden] matrix."""
        llaisys.ops.lora_shrink(out, h, router.view(1, *router.shape), slots, self._one)

    def _rope_pairs(self, out: llaisys.Tensor, x: llaisys.Tensor) -> None:
        """out [n, heads, dr] (contiguous) = x [n, heads, dr] (a strided view) in half-split order: the interleaved
        pairs' first values, then their second ones."""
        if self.mla.rope_interleaved:
            n, heads, dr = x.shape
            x = x.view(n, heads, dr // 2, 2).permute(0, 1, 3, 2)
            out = out.view(n, heads, 2, dr // 2)
        llaisys.ops.rearrange(out, x)

    def _run_step(self, pool: KVPool, step: StepInputs) -> llaisys.Tensor:
        ws = self._workspace(step.num_tokens)
        embedding(ws.x, step.tokens, self.weights.embed_tokens)
        for i, layer in enumerate(self.weights.layers):
            self._latent_attention(layer, self.absorbed[i], ws, pool.layers[i], step)
            self._mlp(layer, ws)
        return self._logits(ws.x, step)

    def _latent_attention(self, w: LayerWeights, a: Absorbed, ws: Workspace, kv: LayerKV, step: StepInputs) -> None:
        c, m, ops, n, numerics = self.config, self.mla, llaisys.ops, ws.n, self.numerics
        heads, dn, dc = c.num_attention_heads, m.qk_nope_head_dim, m.kv_lora_rank
        assert w.kv_a_proj is not None and w.kv_rope_proj is not None  # (the loader's plan: an MLA layer's)
        ops.rms_norm(ws.h, ws.x, w.input_norm, c.rms_norm_eps, numerics)
        q = ws.q.view(n, heads * ws.q.shape[2])
        if w.q_a_proj is not None:  # q through its low-rank pair (q_lora_rank)
            assert w.q_b_proj is not None
            linear(ws.q_a, ws.h, w.q_a_proj)
            ops.rms_norm(ws.q_a, ws.q_a, w.q_a_norm, c.rms_norm_eps, numerics)
            linear(q, ws.q_a, w.q_b_proj)
        else:
            assert w.q_proj is not None
            linear(q, ws.h, w.q_proj)
        ops.rearrange(ws.q_nope, ws.q.slice(2, 0, dn))
        self._rope_pairs(ws.q_pe, ws.q.slice(2, dn, ws.q.shape[2]))
        ops.rope(ws.q_pe, ws.q_pe, step.positions, self.rope_inv_freq, self.rope_scale, numerics)
        # the latent and the rope key, to the cache
        linear(ws.kv_c.view(n, dc), ws.h, w.kv_a_proj)
        ops.rms_norm(ws.kv_c, ws.kv_c, w.kv_a_norm, c.rms_norm_eps, numerics)
        linear(ws.kv_rope.view(n, m.qk_rope_head_dim), ws.h, w.kv_rope_proj)
        self._rope_pairs(ws.k_pe, ws.kv_rope)
        ops.rope(ws.k_pe, ws.k_pe, step.positions, self.rope_inv_freq, self.rope_scale, numerics)
        kv.write(ws.kv_c, ws.k_pe, step)
        # absorbed attention: q_nope W_uk beside q_pe, over the latents; then W_uv per head, then o_proj
        moe_linear(ws.latent, ws.q_nope, a.uk_t, ws.head_ids)
        ops.rearrange(ws.q_latent.slice(2, 0, dc), ws.latent)
        ops.rearrange(ws.q_latent.slice(2, dc, ws.q_latent.shape[2]), ws.q_pe)
        kv.attend(ws.latent, ws.q_latent, step, self.attention_scale, numerics, 0)
        moe_linear(ws.attn, ws.latent, a.uv, ws.head_ids)
        linear(ws.out, ws.attn.view(n, heads * m.v_head_dim), w.o_proj)
        ops.add(ws.x, ws.x, ws.out)

    def _mlp(self, w: LayerWeights, ws: Workspace) -> None:
        if w.experts is None:  # the first_k_dense_replace layers
            return super()._mlp(w, ws)
        c, ops, e, routing = self.config, llaisys.ops, w.experts, self.config.routing
        assert routing is not None  # (deepseek_v2 / v3's config rules always set it)
        ops.rms_norm(ws.h, ws.x, w.mlp_norm, c.rms_norm_eps, self.numerics)
        self._router_logits(ws.router_logits, ws.h, e.router, ws.router_slot)
        ops.moe_router_grouped(ws.route_weights, ws.route_experts, ws.router_logits, e.router_bias,
                               scoring=routing.scoring, n_group=routing.n_group, topk_group=routing.topk_group,
                               group_top=routing.group_top, normalize=c.norm_topk_prob,
                               route_scale=routing.route_scale)
        moe_linear(ws.expert_gate, ws.h, e.gate, ws.route_experts)
        moe_linear(ws.expert_up, ws.h, e.up, ws.route_experts)
        ops.swiglu(ws.expert_act, ws.expert_gate, ws.expert_up, self.numerics)
        moe_linear(ws.expert_out, ws.expert_act, e.down, ws.route_experts)
        ops.moe_combine(ws.out, ws.expert_out, ws.route_weights)
        if w.shared_gate is not None:  # every token's shared experts, added to the routed ones
            assert w.shared_up is not None and w.shared_down is not None  # (the loader's plan: all three)
            linear(ws.shared_gate, ws.h, w.shared_gate)
            linear(ws.shared_up, ws.h, w.shared_up)
            ops.swiglu(ws.shared_gate, ws.shared_gate, ws.shared_up, self.numerics)
            linear(ws.shared_out, ws.shared_gate, w.shared_down)
            ops.add(ws.out, ws.out, ws.shared_out)
        ops.add(ws.x, ws.x, ws.out)


def latent_attention(raw: dict, interleaved: bool) -> LatentAttention:
    """MLA's dimensions, checked: every one positive (q_lora_rank may be absent: one q projection), the rope
    dims even."""
    q_rank = raw.get("q_lora_rank")
    mla = LatentAttention(q_lora_rank=0 if q_rank is None else integer(raw, "q_lora_rank"),
                          kv_lora_rank=integer(raw, "kv_lora_rank"),
                          qk_nope_head_dim=integer(raw, "qk_nope_head_dim"),
                          qk_rope_head_dim=integer(raw, "qk_rope_head_dim"),
                          v_head_dim=integer(raw, "v_head_dim"), rope_interleaved=interleaved)
    for field in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        if getattr(mla, field) < 1:
            raise ModelLoadError(f"config field {field!r} = {getattr(mla, field)} must be at least 1")
    if mla.qk_rope_head_dim % 2:
        raise ModelLoadError(f"config field 'qk_rope_head_dim' = {mla.qk_rope_head_dim} must be even (rope turns "
                             f"pairs)")
    return mla


def grouped_routing(raw: dict, experts: int, per_token: int, scoring: str, group_top: int,
                    corrected: bool) -> GroupedRouting:
    """The router's groups, checked: n_group divides the experts, topk_group <= n_group, and the eligible
    groups hold num_experts_per_tok experts."""
    n_group = integer(raw, "n_group", 1) if raw.get("n_group") is not None else 1
    topk_group = integer(raw, "topk_group", n_group) if raw.get("topk_group") is not None else n_group
    if n_group < 1 or experts % n_group:
        raise ModelLoadError(f"config field 'n_group' = {n_group} does not divide n_routed_experts = {experts}")
    if not 1 <= topk_group <= n_group:
        raise ModelLoadError(f"config field 'topk_group' = {topk_group} must be in [1, n_group = {n_group}]")
    if per_token > topk_group * (experts // n_group):
        raise ModelLoadError(f"config field 'num_experts_per_tok' = {per_token} exceeds the {topk_group} eligible "
                             f"groups' {topk_group * (experts // n_group)} experts")
    return GroupedRouting(scoring=scoring, n_group=n_group, topk_group=topk_group,
                          group_top=min(group_top, experts // n_group),
                          route_scale=number(raw, "routed_scaling_factor", 1.0), corrected=corrected)


def deepseek_fields(raw: dict, layers: int, *, scoring: str, group_top: int, corrected: bool,
                    interleaved: bool, normalize: bool) -> dict:
    """The ModelConfig fields V2 and V3 share: MLA, the experts of the layers from first_k_dense_replace on (the
    shared ones moe_intermediate_size x n_shared_experts wide), the router."""
    if raw.get("n_routed_experts") is None:
        raise ModelLoadError("config field 'n_routed_experts' is missing (a DeepSeek model without experts)")
    experts, per_token = expert_counts(raw, "n_routed_experts")
    first_dense = integer(raw, "first_k_dense_replace", 0) if raw.get("first_k_dense_replace") is not None else 0
    inter = integer(raw, "moe_intermediate_size")
    shared = integer(raw, "n_shared_experts", 0) if raw.get("n_shared_experts") is not None else 0
    mla = latent_attention(raw, interleaved)
    mtp = integer(raw, "num_nextn_predict_layers", 0) if raw.get("num_nextn_predict_layers") is not None else 0
    return dict(num_nextn_predict_layers=mtp, qkv_bias=False, o_bias=False, fused_projections=True, mla=mla,
                head_dim=mla.qk_rope_head_dim,
                routing=grouped_routing(raw, experts, per_token, scoring, group_top, corrected),
                num_experts=experts, num_experts_per_tok=per_token, norm_topk_prob=normalize,
                moe_intermediate_size=inter, shared_expert_size=inter * shared,
                sparse_layers=tuple(range(first_dense, layers)))


def refuse_attention_bias(raw: dict) -> None:
    if flag(raw, "attention_bias"):
        raise ModelLoadError("config field 'attention_bias' = true (biased MLA projections) is not supported")
