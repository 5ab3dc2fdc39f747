"""A scripted reasoning model: a one-layer Qwen2 whose next token depends on its last token alone, so its replies
are known text, with ``<think>`` / ``</think>`` as tokens and a DeepSeek-R1 or a Qwen3 chat template.

The weights make the logits ``SCRIPTED_LOGIT * onehot(NEXT[last token])``: the embedding of token t is the unit
vector e_t (plus a constant direction), attention and MLP write nothing (o_proj and down_proj are zero), and
lm_head row v picks out the tokens whose successor is v. Where the last token has no successor, "4" wins (the
constant direction's logit, PRIOR_LOGIT), then "2", then EOS: a grammar that forbids the scripted token gets "42".

    R1 prompt ends ``<|assistant|><think>\\n``   reply  ``Hmm, two plus forty</think>\\n\\nForty-two.``
    Qwen3 prompt ends ``<|assistant|>``           reply  ``<think>\\nHmm, two plus forty</think>\\n\\nForty-two.``
    Qwen3, enable_thinking false: the prompt ends ``</think>\\n\\n``, reply ``Forty-two.``

The tags are special tokens (as no real model has them: a detokenizer that skips special tokens drops them, so
the server must keep their text: ``Request.keep_tokens``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

THOUGHT, ANSWER = "Hmm, two plus forty", "Forty-two."
SPECIALS = ["<|endoftext|>", "<think>", "</think>", "<|user|>", "<|assistant|>"]  # ids 256 .. 260
WORDS = ["Hmm", " two", " plus", " forty", "\n\n", "Forty-two"]  # plain added tokens, ids 261 ..
EOS = 256
HIDDEN = 320  # one dimension per token id, and the constant one last
SCRIPTED_LOGIT, PRIOR_LOGIT = 30.0, 2.0  # (30: sampled at temperature 1, a wrong token is a 1e-11 chance)
# each token's successor, by text (single characters are byte tokens)
NEXT = {"<|assistant|>": "<think>", "<think>": "\n", "\n": "Hmm", "Hmm": ",", ",": " two", " two": " plus",
        " plus": " forty", " forty": "</think>", "</think>": "\n\n", "\n\n": "Forty-two", "Forty-two": ".",
        ".": "<|endoftext|>", "4": "2", "2": "<|endoftext|>"}

_HISTORY = ("{%- for m in messages -%}"
            "{%- if m['role'] == 'assistant' -%}"
            "<|assistant|>{{ m['content'].split('</think>')[-1].lstrip() }}<|endoftext|>"
            "{%- else -%}<|user|>{{ m['content'] }}{%- endif -%}"
            "{%- endfor -%}")
_TOOLS = ("{%- if tools -%}<|user|>Tools: {{ tools | tojson }}. Call one as "
          "<tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>{%- endif -%}")
# DeepSeek-R1's way: the generation prompt opens the thinking
R1_TEMPLATE = _TOOLS + _HISTORY + "{%- if add_generation_prompt -%}{{ '<|assistant|><think>\\n' }}{%- endif -%}"
# Qwen3's: the model opens it, unless enable_thinking is false (an empty thinking in the prompt)
QWEN3_TEMPLATE = (_TOOLS + _HISTORY + "{%- if add_generation_prompt -%}<|assistant|>"
                  "{%- if enable_thinking is defined and enable_thinking is false -%}"
                  "{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif -%}{%- endif -%}")


def write_tokenizer(directory: Path, template: str) -> None:
    """Byte-level tokens 0..255, SPECIALS from 256, then WORDS; ``template`` its chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {sym: b for b, sym in bytes_to_unicode().items()}
    core = Tokenizer(BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in WORDS])
    fast = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = template
    fast.save_pretrained(directory)
    (directory / "chat_template.jinja").unlink(missing_ok=True)  # (kept in tokenizer_config.json instead)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def make_reasoning_model(directory: Path, template: str) -> Path:
    """The scripted checkpoint in ``directory`` with ``template`` (R1_TEMPLATE, QWEN3_TEMPLATE)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from llaisys_models.text.tokenizer import load_tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    write_tokenizer(directory, template)
    tokenizer = load_tokenizer(directory)
    vocab = len(tokenizer)
    assert vocab < HIDDEN, "a dimension per token, and the constant one"

    def token(text: str) -> int:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        assert len(ids) == 1, (text, ids)
        return ids[0]

    config = Qwen2Config(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=5, num_key_value_heads=1, max_position_embeddings=1024,
                         tie_word_embeddings=False, rms_norm_eps=1e-6, eos_token_id=EOS, bos_token_id=None,
                         pad_token_id=EOS)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                p.zero_()
        embed = torch.zeros(vocab, HIDDEN)
        embed[torch.arange(vocab), torch.arange(vocab)] = 1.0
        embed[:, HIDDEN - 1] = 1.0  # the constant direction
        model.model.embed_tokens.weight.copy_(embed)
        scale = (HIDDEN / 2) ** 0.5  # what the final RMSNorm makes of each of a token's two unit entries
        head = torch.zeros(vocab, HIDDEN)
        for last, following in NEXT.items():
            head[token(following), token(last)] = SCRIPTED_LOGIT / scale
        head[token("4"), HIDDEN - 1] = PRIOR_LOGIT / scale
        model.lm_head.weight.copy_(head)
    model.generation_config.eos_token_id = EOS
    model.save_pretrained(directory)
    return directory
