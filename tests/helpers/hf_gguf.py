"""HF transformers reading a GGUF file: the reference the GGUF tests compare with."""

from __future__ import annotations

import copy

import torch

from helpers.tiny_models import EOS_ID, Reference

NEW_TOKENS = 16


def hf_reference(path, ids: list[int], **kwargs) -> Reference:
    """HF transformers reading the GGUF file ``path`` (``kwargs``: more of from_pretrained's): its greedy tokens
    after ``ids`` and its logits (float32 and exact float64) along them."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32, **kwargs).eval()
    with torch.no_grad():
        x = torch.tensor([ids])
        tokens = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=EOS_ID)[0].tolist()
        seq = torch.tensor([tokens[:-1]])
        logits = hf(seq).logits[0].numpy()
        exact = copy.deepcopy(hf).to(torch.float64)(seq).logits[0].numpy()
    return Reference(ids, tokens, logits, exact)
