"""Operators: output first, validated here, executed by the tensor's backend."""

from ._dispatch import clear_plans, implemented
from .elementwise import add, geglu_tanh, rearrange, scale, swiglu
from .gq import GQ_BITS, dequantize_gq, gq_perm, gq_shapes, linear_gq, pack_gq, unpack_gq
from .int8 import INT8_BLOCK_ROWS, INT8_GROUP, int8_shapes, pack_int8, unpack_int8
from .latent import paged_latent_attention
from .lora import lora_expand, lora_shrink
from .masking import mask_logits
from .moe import ROUTER_SCORINGS, moe_combine, moe_linear, moe_linear_i8, moe_linear_q, moe_router, moe_router_grouped
from .nn import embedding, embedding_q, linear, linear_i8, linear_q, rms_norm, rope, rope_inv_freq, self_attention
from .paged import paged_attention, paged_kv_write
from .paged_q import KV_FORMATS, dequantize_kv, paged_attention_q, paged_kv_write_q, quantize_kv
from .quant import QUANT_BLOCK_ROWS, QUANT_FORMATS, QUANT_GROUP, dequantize_quant, pack_quant, quant_shapes, unpack_quant
from .sampling import LOGPROBS_MAX_K, argmax, logprobs, penalize_logits, sample

__all__ = ["GQ_BITS", "INT8_BLOCK_ROWS", "KV_FORMATS", "INT8_GROUP", "LOGPROBS_MAX_K", "QUANT_BLOCK_ROWS",
           "QUANT_FORMATS", "QUANT_GROUP", "add", "argmax", "clear_plans", "dequantize_gq", "dequantize_kv",
           "dequantize_quant", "embedding", "embedding_q", "geglu_tanh", "gq_perm", "gq_shapes", "implemented",
           "int8_shapes", "linear", "linear_gq", "linear_i8", "linear_q", "logprobs", "lora_expand", "lora_shrink",
           "mask_logits", "moe_combine", "moe_linear", "moe_linear_i8", "moe_linear_q",
           "moe_router", "moe_router_grouped", "pack_gq", "pack_int8", "pack_quant", "paged_attention",
           "paged_attention_q", "paged_kv_write", "paged_kv_write_q", "paged_latent_attention", "ROUTER_SCORINGS",
           "penalize_logits", "quant_shapes", "quantize_kv", "rearrange", "rms_norm", "rope", "rope_inv_freq",
           "sample", "scale", "self_attention", "swiglu", "unpack_gq", "unpack_int8", "unpack_quant"]
