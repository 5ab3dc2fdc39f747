"""paged_latent_attention of the CUDA sources (ops/paged_attention.cu: paged_attention's kernel body reading a latent
cache), run on CPU threads (host execution) at warp 32 and 64 under ASan / UBSan.

DeepSeek's MLA in its absorbed form over a paged latent cache: c [num_slots, dc] and r [num_slots, dr] per token,
q [T, H, dc + dr], score(i, h, j) = scale * (q[i, h, :dc] . c[j] + q[i, h, dc:] . r[j]) and out [T, H, dc] =
softmax @ c. Checked against float64 (several sequences of decode and prompt rows, padding, blocks out of order, f32
/ f16 / bf16, a small and a DeepSeek-sized latent, heads split over blocks), as paged_attention's bits over the
equivalent one-kv-head caches (k = concat(c, r), v = c), alone == batched bit for bit, and its index checks.
"""

import math

import pytest
import torch
from host_exec.device import SlotError

from helpers.host_exec_ops import CODE, check, dtype_ids, randn

pytestmark = pytest.mark.slow  # compiles the CUDA sources under ASan for host execution (cached; minutes of CPU)


def latent_reference(q, c, r, scale):
    """float64 absorbed MLA of one sequence: q [L, H, dc + dr], c [S, dc], r [S, dr], its L rows the last L
    positions (causal, bottom-right)."""
    L, S, dc = q.shape[0], c.shape[0], c.shape[1]
    q, c, r = q.double(), c.double(), r.double()
    scores = (torch.einsum("lhd,sd->hls", q[..., :dc], c) + torch.einsum("lhd,sd->hls", q[..., dc:], r)) * scale
    visible = torch.arange(S)[None, :] <= torch.arange(L)[:, None] + (S - L)
    weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    return torch.einsum("hls,sd->lhd", weights, c)


class LatentBatch:
    """A batch of sequences over shuffled blocks of random latent caches. lens: (L, S) per sequence; extra_rows past
    the last sequence belong to none."""

    def __init__(self, dev, dtype, lens, H, dc, dr, block_size, extra_rows=0, seed=30):
        g = torch.Generator().manual_seed(seed)
        self.dev, self.dtype, self.lens = dev, dtype, lens
        need = [-(-S // block_size) for _, S in lens]
        num_blocks, max_blocks = sum(need) + 2, max(need + [1])
        self.c = randn((num_blocks, block_size, dc), dtype, seed)
        self.r = randn((num_blocks, block_size, dr), dtype, seed + 1)
        order = torch.randperm(num_blocks, generator=g).tolist()
        self.tables = torch.zeros((len(lens), max_blocks), dtype=torch.int32)
        self.dense = []
        for s, (_, S) in enumerate(lens):
            blocks = [order.pop() for _ in range(need[s])]
            self.tables[s, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
            rows = [blocks[j // block_size] * block_size + j % block_size for j in range(S)]
            self.dense.append((self.c.reshape(-1, dc)[rows], self.r.reshape(-1, dr)[rows]))  # [S, dc], [S, dr]
        self.starts = torch.tensor([0] + [L for L, _ in lens], dtype=torch.int32).cumsum(0).to(torch.int32)
        T = int(self.starts[-1]) + extra_rows
        self.q = randn((T, H, dc + dr), dtype, seed + 2)
        self.args = (T, len(lens), H, dc, dr, num_blocks, block_size, max_blocks)
        self.seq_lens = torch.tensor([S for _, S in lens], dtype=torch.int32)

    def index(self, tables=None, seq_lens=None, starts=None):
        return tuple(self.dev.upload(x) for x in (self.tables if tables is None else tables,
                                                  self.seq_lens if seq_lens is None else seq_lens,
                                                  self.starts if starts is None else starts))

    def attention(self, scale, caches=None, q=None, args=None, index=None):
        args = self.args if args is None else args
        T, H, dc = args[0], args[2], args[3]
        out = self.dev.empty((T, H, dc), self.dtype)
        caches = caches or (self.dev.upload(self.c), self.dev.upload(self.r))
        self.dev.op("paged_latent_attention", CODE[self.dtype], *args, scale, out,
                    self.dev.upload(self.q if q is None else q), *caches, *(index or self.index()))
        return self.dev.download(out)

    def check(self, got, scale):
        for s, (L, _) in enumerate(self.lens):
            rows = slice(int(self.starts[s]), int(self.starts[s + 1]))
            if L:
                check(got[rows], latent_reference(self.q[rows], *self.dense[s], scale), self.dtype)
        assert (got[int(self.starts[-1]):] == 0).all()  # rows outside every sequence


# (L, S) per sequence: decode rows, a chunk of a prompt, a sequence without rows (padding), a whole prompt, keys over
# several tiles, a partial last block; (H, dc, dr), block_size. The DeepSeek-sized latent (dc 512, dr 64) takes a
# smaller key tile; with 32 heads they do not fit one block of the emulated device's 99 KiB: 2 blocks of 16 heads
LATENT = [
    ([(1, 5), (4, 17), (0, 9), (1, 1)], (4, 32, 8), 4),
    ([(1, 150), (3, 3), (2, 70), (5, 5)], (3, 32, 8), 16),
    ([(1, 40), (3, 12), (0, 3), (2, 2)], (4, 512, 64), 16),
    ([(1, 20), (2, 9)], (32, 512, 64), 8),
]

# (dtype, LATENT case): every case and dtype, not every product (ASan time)
RUNS = [(torch.float32, 0), (torch.float16, 0), (torch.bfloat16, 1), (torch.float32, 1), (torch.bfloat16, 2),
        (torch.float16, 2), (torch.float32, 3), (torch.bfloat16, 3)]


@pytest.mark.parametrize("dtype,case", RUNS, ids=lambda x: dtype_ids.get(x, str(x)))
def test_latent_attention_matches_the_reference(dev, dtype, case):
    lens, (H, dc, dr), block_size = LATENT[case]
    batch = LatentBatch(dev, dtype, lens, H, dc, dr, block_size, extra_rows=2, seed=30 + case)
    scale = 1 / math.sqrt(dc + dr)
    batch.check(batch.attention(scale), scale)


@pytest.mark.parametrize("case", [1, 2])
def test_latent_attention_is_paged_attentions_over_the_concatenated_keys(dev, case):
    """In f32, paged_attention over one kv head with keys concat(c, r) and values c gives the same bits: one kernel
    body (the same key tile for the same sizes)."""
    lens, (H, dc, dr), block_size = LATENT[case]
    batch = LatentBatch(dev, torch.float32, lens, H, dc, dr, block_size, extra_rows=1, seed=50 + case)
    got = batch.attention(0.3)
    T, num_seqs, _, _, _, num_blocks, _, max_blocks = batch.args
    k = torch.cat([batch.c, batch.r], dim=-1)[:, :, None, :]  # [blocks, bs, 1, dc + dr]
    v = batch.c[:, :, None, :].contiguous()
    out = dev.empty(got.shape, torch.float32)
    dev.op("paged_attention", CODE[torch.float32], 0, T, num_seqs, H, 1, dc + dr, dc, num_blocks, block_size,
           max_blocks, 0, 0.3, out, dev.upload(batch.q), dev.upload(k), dev.upload(v), *batch.index())
    assert torch.equal(dev.download(out).view(torch.int32), got.view(torch.int32))


@pytest.mark.parametrize("case", [1, 3])
def test_a_sequence_alone_or_batched_bit_for_bit(dev, case):
    """A sequence's rows do not depend on the other sequences of the batch nor on where its blocks lie."""
    dt = torch.bfloat16
    lens, (H, dc, dr), bs = LATENT[case]
    batch = LatentBatch(dev, dt, lens, H, dc, dr, bs)
    batched = batch.attention(0.3)
    i32 = lambda *values: torch.tensor(values, dtype=torch.int32)  # noqa: E731
    for s, (L, S) in enumerate(lens):
        if not L:
            continue
        nb = -(-S // bs)
        blocks = batch.tables[s, :nb].tolist()  # the sequence's blocks copied to 0, 1, ... in order
        caches = (dev.upload(batch.c[blocks].contiguous()), dev.upload(batch.r[blocks].contiguous()))
        rows = slice(int(batch.starts[s]), int(batch.starts[s + 1]))
        alone = batch.attention(0.3, caches=caches, q=batch.q[rows], args=(L, 1, H, dc, dr, nb, bs, nb),
                                index=tuple(dev.upload(x) for x in (i32(*range(nb)), i32(S), i32(0, L))))
        assert torch.equal(alone.view(torch.int16), batched[rows].view(torch.int16)), f"sequence {s}"


@pytest.mark.parametrize("case,named", [
    ("block id", "paged_latent_attention: block_tables entry 7 = 99 is not a block in [0, 13)"),
    ("negative block id", "paged_latent_attention: block_tables entry 5 = -1 is not a block"),
    ("seq_len", "paged_latent_attention: seq_lens[1] = 40"),
    ("query_start", "paged_latent_attention: query_start[3] = 9"),
])
def test_bad_index_data_is_reported(dev, case, named):
    lens, (H, dc, dr), bs = LATENT[0]
    batch = LatentBatch(dev, torch.float32, lens, H, dc, dr, bs)
    assert batch.args[5] == 13 and batch.args[7] == 5  # num_blocks, max_blocks: entry 7 is [1, 2], 5 is [1, 0]
    tables, seq_lens, starts = None, None, None
    if case == "block id":
        tables = batch.tables.clone()
        tables[1, 2] = 99
    elif case == "negative block id":
        tables = batch.tables.clone()
        tables[1, 0] = -1
    elif case == "seq_len":
        seq_lens = torch.tensor([5, 40, 9, 1], dtype=torch.int32)  # past max_blocks * block_size
    else:
        starts = torch.tensor([0, 1, 5, 9, 6], dtype=torch.int32)  # not ascending
    with pytest.raises(SlotError) as info:
        batch.attention(0.25, index=batch.index(tables, seq_lens, starts))
    assert info.value.status == 1 and named in info.value.message, info.value.message


def test_padding_reads_no_block(dev):
    """A sequence with no query rows (L = 0) reads nothing: its block table may hold anything."""
    lens, (H, dc, dr), bs = LATENT[0]
    batch = LatentBatch(dev, torch.float16, lens, H, dc, dr, bs, extra_rows=1)
    tables = batch.tables.clone()
    tables[2] = -7  # sequence 2: (0, 9)
    got = batch.attention(0.2, index=batch.index(tables))
    batch.check(got, 0.2)
