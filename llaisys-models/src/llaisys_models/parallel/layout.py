"""Which part of each weight rank ``rank`` of ``world`` holds (Megatron-style tensor parallelism).

    attention   q/k/v: rows (output features) of this rank's heads; o_proj: the same columns (input
                features), its partial sums all-reduced; kv heads split like the q heads they serve, or
                replicated when there are fewer kv heads than ranks (rank r then keeps the one its q heads read)
    MLP         gate/up: rows [r I/N, (r+1) I/N); down_proj: those columns, all-reduced
    experts     (a mixture of experts) every expert split as the MLP is: rows [a, b) of each expert's gate/up,
                those columns of its down, the I' = moe_intermediate_size features split as evenly as whole
                granules allow (a GGUF file's experts kept in blocks: the block of their down matrices, 32 or 256
                values, so that no rank's columns cut one); the router whole, so every rank routes each token to
                the same experts; the weighted sum of a rank's expert outputs is its partial sum, all-reduced
    lm_head     rows of the vocabulary [r V', (r+1) V'), V' = ceil(V / N) (the last padded with zero rows),
                the logits all-gathered; the embedding, the norms and q/k norms are whole on every rank
                (per-head q/k norms only: OLMo 2's, over all heads, are not split)
    biases      split with their rows; o_proj's and down_proj's (added once to the sum) on rank 0 alone

Experts are split by rows rather than handed out whole (expert parallelism): every rank then reads 1/N of each
routed expert, so a decode step's work is even whatever the router picks (a token's k experts could all sit on
one rank), and the all-reduce is the one the dense MLP already does.

Splitting the lm_head (rather than replicating it) takes V' x hidden of each rank's memory and reads per
token instead of V x hidden (for Qwen2-1.5B, 0.47 GB of 3.1 GB in bf16), for one all-gather of the step's
logit rows. A rank's model is the decoder on a config with its own head counts and MLP width
(``local_config``): its KV cache holds its kv heads only.
"""

from __future__ import annotations

import dataclasses

from ..errors import ModelLoadError
from ..families.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Part:
    """Rows (dim 0) or columns (dim 1) [start, stop) of a checkpoint tensor, padded with zero rows to ``rows``
    rows when given (the last rank's share of the vocabulary)."""
    dim: int
    start: int
    stop: int
    rows: int | None = None

    def shape(self, full: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of this part of a tensor of shape ``full``."""
        if self.dim == 0:
            return (self.rows or self.stop - self.start, *full[1:])
        return (full[0], self.stop - self.start, *full[2:])


DROP = "drop"  # a weight this rank does not hold (a row-parallel bias: rank 0 adds it once)

_BY_Q_HEADS = {"q_proj": 0, "q_bias": 0, "o_proj": 1}
_BY_KV_HEADS = ("k_proj", "v_proj", "k_bias", "v_bias")
_BY_MLP = {"gate_proj": 0, "up_proj": 0, "gate_bias": 0, "up_bias": 0, "down_proj": 1}
_BY_EXPERT_WIDTH = {"experts_gate": 0, "experts_up": 0, "experts_down": 1}  # (a dim of each expert's matrix)
_ON_RANK_0 = ("o_bias", "down_bias")


@dataclasses.dataclass(frozen=True)
class Layout:
    rank: int
    world: int
    # a mixture's experts are split into runs of whole granules of this many intermediate features (a GGUF
    # file's experts kept in their blocks: the block size of their down matrices' type; 1 otherwise)
    expert_granule: int = 1

    @staticmethod
    def check(config: ModelConfig, world: int) -> None:
        """Raise ModelLoadError, naming the size, when ``config``'s model cannot be split ``world`` ways."""
        c = config
        if world < 1:
            raise ModelLoadError(f"tensor_parallel must be >= 1, got {world}")
        if world == 1:
            return
        if c.mla is not None:  # (its heads would split kv_b_proj's rows and the absorbed matrices, not yet written)
            raise ModelLoadError(f"tensor parallelism does not split latent attention ({c.architecture}) yet")
        if c.qk_norm_all_heads:  # (each rank would need the sums of squares of every rank's heads)
            raise ModelLoadError(f"tensor parallelism does not split an RMSNorm over all heads ({c.architecture}'s "
                                 f"q/k norms) yet")
        problems = []
        if c.num_attention_heads % world:
            problems.append(f"num_attention_heads = {c.num_attention_heads}")
        kv = c.num_key_value_heads
        if (kv >= world and kv % world) or (kv < world and world % kv):
            problems.append(f"num_key_value_heads = {kv} (a multiple or a divisor of the ranks)")
        if c.intermediate_size % world:
            problems.append(f"intermediate_size = {c.intermediate_size}")
        if c.num_experts and c.moe_intermediate_size < world:
            problems.append(f"moe_intermediate_size = {c.moe_intermediate_size} (at least a feature a rank)")
        if problems:
            raise ModelLoadError(f"{c.architecture} cannot be split over {world} ranks: {', '.join(problems)} "
                                 f"must divide evenly")

    def q_heads(self, c: ModelConfig) -> tuple[int, int]:
        per = c.num_attention_heads // self.world
        return self.rank * per, (self.rank + 1) * per

    def kv_heads(self, c: ModelConfig) -> tuple[int, int]:
        kv = c.num_key_value_heads
        if kv >= self.world:
            per = kv // self.world
            return self.rank * per, (self.rank + 1) * per
        head = self.rank // (self.world // kv)  # the kv head this rank's q heads read (replicated)
        return head, head + 1

    def expert_width(self, c: ModelConfig) -> tuple[int, int]:
        """The features [start, stop) of each expert's intermediate width this rank holds: whole granules, as
        even a split as they allow (the first ranks one granule more)."""
        g = self.expert_granule
        base, extra = divmod(c.moe_intermediate_size // g, self.world)
        start = self.rank * base + min(self.rank, extra)
        return start * g, (start + base + (self.rank < extra)) * g

    def vocab_rows(self, c: ModelConfig) -> Part:
        per = -(-c.vocab_size // self.world)
        start = min(self.rank * per, c.vocab_size)
        return Part(0, start, min(start + per, c.vocab_size), rows=per)

    def local_config(self, c: ModelConfig) -> ModelConfig:
        """The config of this rank's decoder: its heads, kv heads and MLP (and experts') width (hidden size and
        vocabulary stay: the residual stream is whole on every rank, and the logits are gathered whole)."""
        if self.world == 1:
            return c
        q0, q1 = self.q_heads(c)
        k0, k1 = self.kv_heads(c)
        e0, e1 = self.expert_width(c)
        return dataclasses.replace(c, num_attention_heads=q1 - q0, num_key_value_heads=k1 - k0,
                                   intermediate_size=c.intermediate_size // self.world, moe_intermediate_size=e1 - e0)

    def part(self, field: str, c: ModelConfig) -> Part | str | None:
        """This rank's part of weight ``field`` (a LayerWeights / Weights field name, or a sparse layer's
        experts_gate / _up / _down: then the part of each expert's matrix): a Part, DROP, or None for the whole
        tensor."""
        if self.world == 1:
            return None
        d = c.head_dim
        if field in _BY_Q_HEADS:
            q0, q1 = self.q_heads(c)
            return Part(_BY_Q_HEADS[field], q0 * d, q1 * d)
        if field in _BY_KV_HEADS:
            k0, k1 = self.kv_heads(c)
            return Part(0, k0 * d, k1 * d)
        if field in _BY_MLP:
            per = c.intermediate_size // self.world
            return Part(_BY_MLP[field], self.rank * per, (self.rank + 1) * per)
        if field in _BY_EXPERT_WIDTH:
            return Part(_BY_EXPERT_WIDTH[field], *self.expert_width(c))
        if field in _ON_RANK_0:
            return None if self.rank == 0 else DROP
        if field == "lm_head":
            return self.vocab_rows(c)
        return None
