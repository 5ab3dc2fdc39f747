"""DeepSeek-V3's multi-token prediction (MTP) as a speculative drafter: ``generate(..., speculative="mtp")``.

The module (loading/mtp.py reads it) predicts one token further than the model, from the model's last hidden
state and the token that state predicted. At position p, with h the model's residual stream before its final
norm:

    x = [rms_norm(embed(t_p), enorm), rms_norm(h_{p-1}, hnorm)] Weh         [2 hidden] -> [hidden]
    x = DeepSeek decoder layer (x)         its own latent cache over the positions it has seen, DeepSeekMoE
    logits_p = rms_norm(x, shared_head.norm) Whead                          a guess of t_{p+1}

With the sequence t_0 .. t_{N-1} (t_{N-1} just chosen, not yet run by the model, which gave h up to N - 2), the
module runs the positions it has not seen, up to N - 1, and guesses d1 = t_N; further drafts run the module again
on its own guess and its own x as the hidden state (as vLLM runs one MTP layer for several drafts). Every draft
is verified by the model as any drafter's is, so the tokens are the model's own whatever the module guesses.

The model hands the drafter its hidden states after each forward (``CausalLM.hidden_listener``); they are kept
per sequence only until the module has run their positions. Positions the model did not run (a prefix it reused
from the cache) enter the module's cache with a zero hidden state: the guesses there are worse, never wrong.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

import llaisys

from ..engine.kv_blocks import SequenceKV
from ..engine.kv_cache import KVPool
from ..engine.speculative.drafters import Drafter
from ..engine.step_inputs import Batch, host_step, step_inputs
from .causal_lm import Workspaces
from .weights import embedding, linear

BLOCK_SIZE = 16
FIRST_POOL_BLOCKS = 16

# How a model's checkpoint becomes its module's weights: loading/mtp.py's load_mtp. The loader sits above the
# families, so it hands its reader down when it is imported, as it does the model reader (causal_lm.py).
_read_mtp: Callable[..., Any] | None = None


def set_mtp_reader(read: Callable[..., Any]) -> None:
    """Make ``read(checkpoint, config, family, dtype, device, quantize)`` -> MTPWeights what a model's
    ``mtp_drafter()`` loads its module with."""
    global _read_mtp
    _read_mtp = read


def read_mtp(checkpoint, config, family, dtype, device, quantize):
    """The module's weights (MTPWeights: loading/mtp.py) from the model's checkpoint: a HuggingFace directory's."""
    if _read_mtp is None:
        raise RuntimeError("no loader: import llaisys_models (its loader reads the module)")
    return _read_mtp(checkpoint, config, family, dtype, device, quantize)


@dataclasses.dataclass
class _Tracked:
    """The module's sequence for one of the model's: its cache, and how many of its positions were run on the
    model's hidden states (the later ones, its own drafts', are dropped at the next proposal)."""
    kv: SequenceKV
    exact: int = 0


class MTPDrafter(Drafter):
    """Drafts with ``model``'s multi-token-prediction module (``model.mtp``, a DeepSeek model's)."""

    def __init__(self, model) -> None:
        self.model, self.mtp = model, model.mtp
        shape = dataclasses.replace(model.kv_shape, num_layers=1)
        self.pool = KVPool(shape, FIRST_POOL_BLOCKS, BLOCK_SIZE, prefix_caching=False)
        self._lock = threading.Lock()
        self._sequences: dict[int, _Tracked] = {}  # the model's sequence id -> the module's
        # the model's hidden states not yet run by the module, per model SequenceKV: (first position, rows)
        self._hidden: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._workspaces = Workspaces(lambda: {**model.activations(), "previous": (model.config.hidden_size,),
                                               "joined": (2 * model.config.hidden_size,)},
                                      model.dtype, model.device, model.fill_constants)
        model.hidden_listener = self._listen

    def __repr__(self) -> str:
        return f"MTPDrafter({self.model!r})"

    def _listen(self, batch: Batch, x: llaisys.Tensor) -> None:
        """After a forward of the model: keep each sequence's new rows of x (positions len(kv) ..., before the
        commit), replacing what it kept from those positions on (drafts that were not kept)."""
        rows = x.numpy()
        r = 0
        with self._lock:
            for kv, ids in batch:
                start, n = len(kv), len(ids)
                first, kept = self._hidden.get(kv, (start, rows[:0]))
                kept = kept[:max(0, start - first)] if start >= first else rows[:0]
                first = first if start >= first else start
                self._hidden[kv] = (first, np.concatenate([kept, rows[r:r + n]]) if len(kept) else rows[r:r + n].copy())
                r += n

    def _previous_hidden(self, kv, positions: range) -> np.ndarray:
        """h_{p-1} for each position p (zeros where the model has not given it: position 0, a cached prefix)."""
        hidden = self.model.config.hidden_size
        out = np.zeros((len(positions), hidden), self.model.dtype.numpy)
        first, kept = self._hidden.get(kv, (0, np.zeros((0, hidden), out.dtype)))
        for i, p in enumerate(positions):
            if first <= p - 1 < first + len(kept):
                out[i] = kept[p - 1 - first]
        return out

    def propose(self, seq, k: int) -> list[int]:
        tokens, target = seq.tokens, seq.kv
        k = min(k, self.model.context_length - len(tokens))
        if k < 1 or target is None:
            return []
        with self._lock:
            tracked = self._sequences.get(seq.id)
            if tracked is None:
                tracked = self._sequences[seq.id] = _Tracked(self.pool.sequence())
            kv = tracked.kv
            common = 0
            for a, b in zip(kv.tokens[:tracked.exact], tokens):
                if a != b:
                    break
                common += 1
            kv.truncate(common)
            feed = tokens[common:]
            previous = self._previous_hidden(target, range(common, len(tokens)))
            drafts: list[int] = []
            for i in range(k):
                self.pool.reserve_growing(kv, len(kv) + len(feed))
                token, last = mtp_forward(self.model, self.pool, [(kv, feed)], previous, self._workspaces)
                kv.commit(feed)
                if i == 0:
                    tracked.exact = len(kv)
                    first, kept = self._hidden.get(target, (0, previous[:0]))
                    drop = max(0, len(tokens) - 1 - first)  # (the next proposal needs h from position N - 1 on)
                    self._hidden[target] = (first + drop, kept[drop:])
                drafts.append(token)
                feed, previous = [token], last[None, :]
            return drafts

    def release(self, seq) -> None:
        with self._lock:
            tracked = self._sequences.pop(seq.id, None)
            if tracked is not None:
                tracked.kv.release()
            if seq.kv is not None:
                self._hidden.pop(seq.kv, None)


def mtp_forward(model, pool: KVPool, batch: Batch, previous: np.ndarray,
                workspaces: Workspaces) -> tuple[int, np.ndarray]:
    """One run of ``model``'s module over ``batch`` (one sequence of ``pool``: its new tokens, ``previous`` the
    hidden state before each), in ``workspaces`` (the model's activations, "previous" and "joined"): the greedy
    guess after its last row and that row's x (the next draft's hidden)."""
    c, m, ops = model.config, model.mtp, llaisys.ops
    step = step_inputs(host_step(batch, [1]), model.device)
    ws = workspaces.get(step.num_tokens)
    h = c.hidden_size
    embedding(ws.x, step.tokens, m.model.embed_tokens)
    ops.rms_norm(ws.x, ws.x, m.enorm, c.rms_norm_eps, model.numerics)
    ws.previous.load(np.ascontiguousarray(previous))
    ops.rms_norm(ws.previous, ws.previous, m.hnorm, c.rms_norm_eps, model.numerics)
    ops.rearrange(ws.joined.slice(1, 0, h), ws.x)
    ops.rearrange(ws.joined.slice(1, h, 2 * h), ws.previous)
    linear(ws.x, ws.joined, m.eh_proj)
    layer = m.model.layers[0]
    model._latent_attention(layer, model.mtp_absorbed, ws, pool.layers[0], step)
    model._mlp(layer, ws)
    last = ws.x.slice(0, ws.n - 1, ws.n)
    normed = llaisys.empty((1, h), model.dtype, model.device)
    ops.rms_norm(normed, last, m.model.norm, c.rms_norm_eps, model.numerics)
    logits = llaisys.empty((1, m.model.lm_head.shape[0]), model.dtype, model.device)
    linear(logits, normed, m.model.lm_head)
    guess = int(np.asarray(logits.numpy(), np.float32).argmax())
    return guess, last.numpy()[0].copy()
