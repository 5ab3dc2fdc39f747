"""Prompts for ``llaisys bench serve``: synthetic random words, or a JSONL file.

There is no tokenizer on the client side (the server may serve any model), so synthetic input lengths
are counted in words; the server's ``usage`` says how many tokens they became.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

from llaisys import LlaisysValueError

# Short, common words: most tokenizers make one token of each (with its leading space).
WORDS = ("the of and to in is it you that he was for on are with as his they be at one have this from or had by "
         "word but what some we can out other were all there when up use your how said an each she which do their "
         "time if will way about many then them write would like so these her long make thing see him two has look "
         "more day could go come did number sound no most people my over know water than call first who may down "
         "side been now find any new work part take get place made live where after back little only round man year "
         "came show every good me give our under name very through just form sentence great think say help low line "
         "differ turn cause much mean before move right boy old too same tell does set three want air well also play "
         "small end put home read hand port large spell add even land here must big high such follow act why ask "
         "men change went light kind off need house picture try us again animal point mother world near build self "
         "earth father head stand own page should country found answer school grow study still learn plant cover "
         "food sun four between state keep eye never last let thought city tree cross farm hard start might story "
         "saw far sea draw left late run while press close night real life few north open seem together next white "
         "children begin got walk example ease paper group always music those both mark often letter until mile "
         "river car feet care second book carry took science eat room friend began idea fish mountain stop once "
         "base hear horse cut sure watch color face wood main enough plain girl usual young ready above ever red "
         "list though feel talk bird soon body dog family direct pose leave song measure door product black short "
         "numeral class wind question happen complete ship area half rock order fire south problem piece told knew "
         "pass since top whole king space heard best hour better true during hundred five remember step early hold "
         "west ground interest reach fast verb sing listen six table travel less morning ten simple several vowel "
         "toward war lay against pattern slow center love person money serve appear road map rain rule govern pull "
         "cold notice voice unit power town fine certain fly fall lead cry dark machine note wait plan figure star "
         "box noun field rest correct able pound done beauty drive stood contain front teach week final gave green "
         "oh quick develop ocean warm free minute strong special mind behind clear tail produce fact street inch "
         "multiply nothing course stay wheel full force blue object decide surface deep moon island foot system "
         "busy test record boat common gold possible plane stead dry wonder laugh thousand ago ran check game shape "
         "equate hot miss brought heat snow tire bring yes distant fill east paint language among").split()


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One request's input: ``messages`` for chat, or ``text`` (a prompt, or chat's one user message)."""
    text: str | None
    messages: list[dict[str, Any]] | None
    max_tokens: int
    words: int  # its length as the client sees it (words of the text, or of every message's content)

    def as_messages(self) -> list[dict[str, Any]]:
        return self.messages if self.messages is not None else [{"role": "user", "content": self.text}]


def lengths(mean: int, spread: float, n: int, rng: random.Random) -> list[int]:
    """``n`` lengths uniform in mean * (1 ± spread), each at least 1 (as vLLM's random dataset draws them)."""
    low, high = max(1, int(mean * (1 - spread))), max(1, int(mean * (1 + spread)))
    return [rng.randint(low, high) for _ in range(n)]


def synthetic(n: int, input_len: int, input_spread: float, output_len: int, output_spread: float,
              rng: random.Random) -> list[Prompt]:
    """``n`` prompts of random words (different words in each, so that no two share a cached prefix)."""
    inputs = lengths(input_len, input_spread, n, rng)
    outputs = lengths(output_len, output_spread, n, rng)
    return [Prompt(" ".join(rng.choices(WORDS, k=words)), None, max_tokens, words)
            for words, max_tokens in zip(inputs, outputs)]


def from_jsonl(path: str, n: int, default_max_tokens: list[int], chat: bool) -> list[Prompt]:
    """``n`` prompts from a JSONL file (its lines in order, again from the start where it holds fewer): each line
    an object with ``prompt`` (a string) or, for chat, ``messages`` (OpenAI's list), and optionally
    ``max_tokens``; where it has none, request i gets ``default_max_tokens[i]``."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise LlaisysValueError(f"cannot read the dataset {path}: {e}") from None
    prompts = [_line(path, number, line, chat) for number, line in enumerate(lines, 1) if line.strip()]
    if not prompts:
        raise LlaisysValueError(f"the dataset {path} holds no prompts")
    out = []
    for i in range(n):
        text, messages, max_tokens = prompts[i % len(prompts)]
        if text is not None:
            words = len(text.split())
        else:
            assert messages is not None  # (_line returns one or the other)
            words = sum(len(str(m.get("content") or "").split()) for m in messages)
        out.append(Prompt(text, messages, max_tokens or default_max_tokens[i], words))
    return out


def _line(path: str, number: int, line: str, chat: bool) -> tuple[str | None, list[dict[str, Any]] | None, int | None]:
    """(prompt, messages, max_tokens) of one JSONL line; a LlaisysValueError naming the line where it is wrong."""
    where = f"{path}:{number}"
    try:
        obj = json.loads(line)
    except ValueError as e:
        raise LlaisysValueError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise LlaisysValueError(f"{where}: expected an object with \"prompt\" or \"messages\"")
    text, messages, max_tokens = obj.get("prompt"), obj.get("messages"), obj.get("max_tokens")
    if text is not None and not isinstance(text, str):
        raise LlaisysValueError(f"{where}: \"prompt\" must be a string")
    if messages is not None and not (isinstance(messages, list) and messages
                                     and all(isinstance(m, dict) and "role" in m for m in messages)):
        raise LlaisysValueError(f"{where}: \"messages\" must be a non-empty list of objects with a \"role\"")
    if (text is None) == (messages is None):
        raise LlaisysValueError(f"{where}: expected exactly one of \"prompt\" and \"messages\"")
    if messages is not None and not chat:
        raise LlaisysValueError(f"{where}: \"messages\" needs --endpoint chat; completions take a \"prompt\"")
    if max_tokens is not None and not (isinstance(max_tokens, int) and not isinstance(max_tokens, bool)
                                       and max_tokens >= 1):
        raise LlaisysValueError(f"{where}: \"max_tokens\" must be a positive integer")
    return text, messages, max_tokens
