"""Sliding windows that give memory back: where every layer of a model slides (Mistral-like), the blocks wholly
before the window of a sequence's next forward go back to the pool (kv_blocks.SequenceKV.drop_outside_window), and
the tokens stay those of the model that keeps every block: alone, batched, chunked, from a cached prefix, forked,
preempted and recomputed, and with speculative drafts rolled back. A model with global layers beside its sliding
ones (Gemma 3-like) has a block table per layer group (kv_cache.layer_groups): its sliding groups give their
blocks back while its global one keeps every block, with the same tokens (docs/design/kv-cache.md, "Sliding
windows")."""

from __future__ import annotations

import numpy as np
import pytest

import llaisys_models
from helpers.fake_runner import VOCAB, FakeModel, ScriptedDrafter, ScriptedRunner, alone
from helpers.tiny_models import Spec, make_checkpoint, prompt
from llaisys_models.engine.kv_blocks import DROPPED, WINDOW_READ_SLACK, BlockManager, GroupedSequenceKV
from llaisys_models.engine.kv_cache import KVPool
from llaisys_models.engine.sampling import SamplingParams
from llaisys_models.engine.scheduler import Scheduler
from llaisys_models.engine.speculative import Drafter, Speculation

WINDOW, BS = 32, 16
SPECS = {
    # every layer sees its last 32 positions
    "mistral_w32": Spec(arch="mistral", vocab=320, hidden=64, inter=128, layers=2, heads=4, kv_heads=2,
                        sliding_window=WINDOW, max_pos=1024, seed=21),
    # Gemma 3's shape: five sliding layers of six, then a global one
    "gemma3_w32": Spec(arch="gemma3", vocab=320, hidden=64, inter=128, layers=6, heads=4, kv_heads=2, head_dim=16,
                       tie=True, rope_theta=1e6, sliding_window=WINDOW, window_pattern=6, query_pre_attn_scalar=16,
                       max_pos=1024, seed=22),
}
NEW = 24


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("window_models")
    for name, spec in SPECS.items():
        (root / name).mkdir()
        make_checkpoint(root / name, spec)
    return root, {}


@pytest.fixture
def models(checkpoints, device):
    """The models on ``device``, each loaded once per module."""
    root, loaded = checkpoints
    for name in SPECS:
        if (device, name) not in loaded:
            loaded[device, name] = llaisys_models.load(root / name, device=device)
    return {name: loaded[device, name] for name in SPECS}


def ids(length: int, salt: str = "w") -> list[int]:
    return prompt(salt, length, 256)


def greedy(max_tokens: int = NEW) -> SamplingParams:
    return SamplingParams(max_tokens, top_k=1, eos_token_ids=frozenset())


def keep_all(model, num_blocks: int = 200) -> KVPool:
    """A pool of one block table for every layer that keeps every block (the reference: what every model ran on
    before windows gave blocks back)."""
    return KVPool(model.kv_shape, num_blocks, BS)


def run(model, prompts, *, window=None, num_blocks=200, max_batch_tokens=64, params=None, pool=None):
    """Every prompt through one scheduler; window=0: the pool keeps every block (the reference)."""
    pool = pool or model.new_kv_pool(num_blocks=num_blocks, block_size=BS)
    if window is not None:
        pool.window = window
    sched = Scheduler(model, pool, max_running=len(prompts), max_batch_tokens=max_batch_tokens)
    seqs = [sched.add(p, params or greedy()) for p in prompts]
    while sched.has_work:
        sched.step()
        pool.check()
    assert all(s.finish_reason == "length" for s in seqs)
    return [s.tokens for s in seqs], sched, pool


def held_by(kv) -> int:
    """Blocks a sequence holds: those of its table not given back."""
    return len(kv.blocks) - kv.dropped


def expected_held(length: int, new: int) -> int:
    """Blocks a sequence holds in a forward that writes positions [length, length + new): from the key block
    (of 64) holding the first query's first key to the last position written."""
    first = max(length - WINDOW + 1, 0) // WINDOW_READ_SLACK * WINDOW_READ_SLACK
    return -(-(length + new) // BS) - first // BS


# -- the bookkeeping, without a model ---------------------------------------------------------------

def test_blocks_before_the_window_go_back_and_nothing_else():
    m = BlockManager(64, 4)
    m.window = 8
    seq = m.sequence()
    assert seq.reserve(200)
    seq.commit(list(range(200)))
    # the next forward starts at 200: its first query sees 193..200, read from the key block of 64 at 192
    assert seq.drop_outside_window() == 192 // 4 and seq.dropped == 48 and held_by(seq) == 2
    assert seq.blocks[:48] == [DROPPED] * 48 and DROPPED not in seq.blocks[48:]
    assert m.check()["used"] == 2 and seq.drop_outside_window() == 0
    child = seq.fork(199)  # a fork shares the held full block, copies the partial one
    assert child.dropped == 48 and held_by(child) == 2 and m.refcount(seq.blocks[48]) == 2
    with pytest.raises(RuntimeError, match="were given back"):
        seq.truncate(180)  # its windows would read positions before 192 again
    seq.truncate(199)  # its next forward, from 199, reads from 192 on: fine
    for s in (seq, child):
        s.release()
    assert m.check()["used"] == 0
    m.window = 0  # no window: nothing goes back
    keep = m.sequence()
    assert keep.reserve(200) and keep.drop_outside_window() == 0 and held_by(keep) == 50
    keep.release()


class ContentPool(BlockManager):
    """A block manager whose blocks hold the tokens written into them (``content``: block -> {offset: token})."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.content: dict[int, dict[int, int]] = {}

    def copy_block(self, dst, src):
        self.content[dst] = dict(self.content.get(src, {}))


class GroupedContentPool(ContentPool):
    """A ContentPool whose sequences have a block table per layer group, each group with its window (0: it reads
    every position), as a KVPool of global and sliding layers."""

    def __init__(self, num_blocks: int, block_size: int, windows: list[int]):
        super().__init__(num_blocks, block_size)
        self.windows = windows

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    @property
    def gives_back(self) -> bool:
        return any(self.windows)

    def sequence(self, scope="", adapter=None):
        return GroupedSequenceKV(self, self.windows, scope, adapter)


class WindowRunner(ScriptedRunner):
    """The scripted runner, checking before each forward that every position the window of its first query reads
    is, in each layer group's table, in a block the sequence holds and holds that sequence's token (no block given
    back too early, no wrong prefix reused), then writing the forward's tokens into each group's blocks."""

    def __init__(self, pool: ContentPool):
        super().__init__()
        self.pool, self.most_dropped = pool, 0

    def execute(self, plan):
        bs = self.pool.block_size
        for s in plan.scheduled:
            start = len(s.seq.kv)
            for part in s.seq.kv.parts:
                assert len(part) == start  # (every group holds the same positions)
                self.most_dropped = max(self.most_dropped, part.dropped)
                for pos in range(max(start - part.window + 1, 0) if part.window else 0, start):
                    block = part.blocks[pos // bs]
                    assert block != DROPPED and self.pool.refcount(block) > 0
                    assert self.pool.content[block][pos % bs] == s.seq.tokens[pos]
                for i, token in enumerate(s.input_ids):
                    self.pool.content.setdefault(part.blocks[(start + i) // bs], {})[(start + i) % bs] = token
        return super().execute(plan)


@pytest.mark.parametrize("groups", [None, [20, 0, 20]])  # every layer sliding; a global group between two sliding
@pytest.mark.parametrize("max_batch_tokens", [40, 13])  # 13 beside up to 12 decoding: prompt chunks of 1 token
def test_the_scheduler_never_reads_a_block_given_back(max_batch_tokens, groups):
    """Prompts that share prefixes, forks, drafts cut back, preemption and cache eviction in a small pool, with
    windows that give blocks back (in every layer, or in sliding groups beside a global one): every forward finds
    its windows' positions held (with the right tokens), and every sequence draws what it draws alone."""
    rng = np.random.default_rng(5)
    base = rng.integers(1, VOCAB, 320).tolist()
    if groups is None:
        pool = ContentPool(90, 4)
        pool.window = 20
    else:  # (the global group holds whole prompts: a pool of about the same pressure)
        pool = GroupedContentPool(170, 4, groups)
    runner = WindowRunner(pool)
    sched = Scheduler(FakeModel(), pool, runner=runner, max_running=12,
                      max_batch_tokens=max_batch_tokens)
    expect = {}
    for i in range(14):
        p = base[:int(rng.integers(60, 300))] + rng.integers(1, VOCAB, int(rng.integers(1, 30))).tolist()
        spec = Speculation(ScriptedDrafter(int(rng.integers(0, 3))), 3) if i % 3 == 0 else None
        seq = sched.add(p, SamplingParams(30, seed=i, eos_token_ids=frozenset(), speculation=spec))
        expect[seq] = alone(p, i, 30)
        if i % 4 == 1:
            fork = sched.fork(seq, SamplingParams(30, seed=100 + i, eos_token_ids=frozenset()))
            expect[fork] = alone(p, 100 + i, 30)
    while sched.has_work:
        sched.step()
        pool.check()
    assert all(seq.tokens == tokens for seq, tokens in expect.items())
    st = sched.stats
    assert st.preemptions > 0 and st.prompt_tokens_reused > 0 and st.prompt_tokens_forked > 0
    assert st.draft_tokens > st.accepted_tokens > 0 and runner.most_dropped > 0
    assert pool.check()["used"] == 0


# -- a model whose every layer slides, or global layers beside sliding ones ---------------------------------

def test_windows_give_blocks_back_and_tokens_stay(models):
    """The check of the issue, small: a long prompt's sequence holds its window (plus a key block), not its
    context, measured from the pool after each plan, and draws the tokens of the model that keeps every block."""
    model = models["mistral_w32"]
    assert model.kv_window == WINDOW and model.new_kv_pool(num_blocks=4, block_size=BS).window == WINDOW
    p = ids(600)
    reference, _, _ = run(model, [p], window=0)
    pool = model.new_kv_pool(num_blocks=200, block_size=BS)
    sched = Scheduler(model, pool, max_running=1, max_batch_tokens=128)
    seq = sched.add(p, greedy())
    held = []
    while sched.has_work:
        plan = sched.schedule()
        if plan.scheduled:
            s = plan.scheduled[0]
            assert pool.check()["used"] == held_by(s.seq.kv) == expected_held(len(s.seq.kv), s.num_tokens)
            held.append(held_by(s.seq.kv))
        sched.commit(sched.runner.execute(plan))
    assert seq.tokens == reference[0]
    # decoding (the last NEW - 1 steps): at most the window (32), the key block before it (64) and the block
    # being written: 7 blocks, not the 39 of 624 positions; reading the prompt in chunks of 128: 8 + 2 at most
    assert len(held) == -(-600 // 128) + NEW - 1
    assert max(held[-(NEW - 1):]) <= -(-(WINDOW + WINDOW_READ_SLACK) // BS) + 1 < -(-len(seq.tokens) // BS)
    assert max(held) <= (128 + WINDOW + WINDOW_READ_SLACK) // BS + 2
    assert pool.check()["used"] == 0


def test_gemma3_shape_gives_back_the_sliding_layers_blocks(models):
    """Five sliding layers of six beside a global one: six layer groups of one layer (5 and 1 have no larger common
    divisor), each with its table. A long prompt's sequence holds the global layer's whole context and each
    sliding layer's window (plus a key block), measured from the pool after each plan, and draws the tokens of the
    one-table pool that keeps every block."""
    model = models["gemma3_w32"]
    assert model.config.sliding_layers == (0, 1, 2, 3, 4) and model.kv_window == 0
    assert [(g.window, g.layers) for g in model.kv_layer_groups] == [(WINDOW, (i,)) for i in range(5)] + [(0, (5,))]
    p = ids(600, "g")
    (reference,), _, _ = run(model, [p], pool=keep_all(model))
    pool = model.new_kv_pool(num_blocks=6 * 50, block_size=BS)
    assert pool.num_groups == 6 and 6 * pool.bytes_per_block == keep_all(model, 1).bytes_per_block
    sched = Scheduler(model, pool, max_running=1, max_batch_tokens=128)
    seq = sched.add(p, greedy())
    held = []
    while sched.has_work:
        plan = sched.schedule()
        s = plan.scheduled[0]
        length, n = len(s.seq.kv), s.num_tokens
        held.append(pool.check()["used"])
        assert held[-1] == -(-(length + n) // BS) + 5 * expected_held(length, n)
        sched.commit(sched.runner.execute(plan))
    assert seq.tokens == reference
    # the last step (writing position 623): the global layer's 39 blocks and 3 of each sliding one (from position
    # 576, the key block of 64 that holds its window's first key), against 6 x 39 where every layer keeps all
    assert held[-1] == 39 + 5 * 3 and pool.check()["used"] == 0


# every test below, for a model whose every layer slides and for global layers beside sliding ones (the grouped
# pool takes a block per group where the other takes one for all layers: six times the blocks, the same memory)
BOTH = pytest.mark.parametrize("name", list(SPECS))


def blocks_of(model, num_blocks: int) -> int:
    return num_blocks * len(model.kv_layer_groups)


@BOTH
def test_batched_and_chunked_equal_alone(models, name):
    model = models[name]
    prompts = [ids(n, f"b{n}") for n in (1, 31, 33, 97, 250, 413)]
    alone = [model.generate(q, NEW, eos_token_ids=()) for q in prompts]
    batched, _, pool = run(model, prompts, max_batch_tokens=48, num_blocks=blocks_of(model, 200))
    assert batched == alone
    kept, _, _ = run(model, prompts, max_batch_tokens=48, pool=keep_all(model))
    assert kept == alone


@BOTH
def test_a_cached_prefix_is_reused_where_its_blocks_are_held(models, name):
    """A finished sequence's blocks (those given back early too) stay cached and indexed: a follow-up that starts
    alike reuses them; in a pool so small that the given-back blocks are taken again, the reuse stops where the
    chain of cached blocks breaks (in any group), and the tokens are the same either way."""
    model = models[name]
    first, follow = ids(300, "p"), None
    for num_blocks in (200, 25):  # 25: the follow-up's positions, the cached blocks taken by another prompt
        pool = model.new_kv_pool(num_blocks=blocks_of(model, num_blocks), block_size=BS)
        (out,), _, _ = run(model, [first], pool=pool)
        if num_blocks == 25:
            run(model, [ids(300, "other")], pool=pool)
        follow = out + ids(40, "q")
        (tokens,), sched, _ = run(model, [follow], pool=pool)
        (reference,), _, _ = run(model, [follow], pool=keep_all(model))
        assert tokens == reference
        reused = sched.stats.prompt_tokens_reused
        if num_blocks == 200:
            assert reused == len(out) - 1  # every position the first sequence stored (its last token's were not)
        else:
            assert reused < len(out) - 1  # its first blocks were taken again: never a wrong reuse


@BOTH
def test_forks_preemption_and_rollback_equal_alone(models, name):
    model = models[name]
    prompts = [ids(n, f"r{n}") for n in (120, 200, 260, 150, 230)]
    sampling = SamplingParams(NEW, top_k=0, temperature=1.0, seed=7, eos_token_ids=frozenset())
    alone = [model.generate(q, NEW, top_k=0, seed=7, eos_token_ids=()) for q in prompts]
    # preemption: blocks for the longest sequence's positions (what add() asks), a window's worth for about two
    tokens, sched, _ = run(model, prompts, num_blocks=blocks_of(model, -(-(260 + NEW) // BS)), params=sampling,
                           max_batch_tokens=32)
    assert tokens == alone
    assert sched.stats.preemptions > 0 and sched.stats.recomputed_tokens > 0

    # forks: n choices of one prompt, from the parent's blocks (given back ones included)
    pool = model.new_kv_pool(num_blocks=blocks_of(model, 200), block_size=BS)
    sched = Scheduler(model, pool, max_running=4, max_batch_tokens=64)
    parent = sched.add(prompts[2], sampling)
    forks = [sched.fork(parent, SamplingParams(NEW, top_k=0, temperature=1.0, seed=8 + i,
                                               eos_token_ids=frozenset())) for i in range(2)]
    while sched.has_work:
        sched.step()
    assert sched.stats.prompt_tokens_forked == 2 * len(prompts[2])
    for i, f in enumerate(forks):
        assert f.tokens == model.generate(prompts[2], NEW, top_k=0, seed=8 + i, eos_token_ids=())
    assert parent.tokens == alone[2] and pool.check()["used"] == 0

    # speculative drafts, partly rejected and cut back, never past the blocks given back
    class Oracle(Drafter):
        def __init__(self, full):
            self.full, self.calls = full, 0

        def propose(self, seq, k):
            self.calls += 1
            drafts = list(self.full[len(seq.tokens):len(seq.tokens) + k])
            if self.calls % 3 == 0 and drafts:
                drafts[-1] = (drafts[-1] + 1) % 256
            return drafts

    full = model.generate(prompts[1], NEW, eos_token_ids=())
    drafter = Oracle(full)
    spec = SamplingParams(NEW, top_k=1, eos_token_ids=frozenset(), speculation=Speculation(drafter, 4))
    (tokens,), sched, pool = run(model, [prompts[1]], params=spec, num_blocks=blocks_of(model, 200))
    assert tokens == full and sched.stats.draft_tokens > sched.stats.accepted_tokens > 0


def test_an_8k_prompt_holds_the_global_context_and_the_windows(tmp_path, device):
    """The issue's check: a Gemma 3-shaped model (five layers of six sliding over 512 positions), an 8192-token
    prompt. While it decodes, the pool holds the global layer's whole context and about a window (and a key
    block) of each sliding layer, measured from the pool: under a quarter of the blocks of the one-table pool that
    keeps every block, whose tokens it draws."""
    spec = Spec(arch="gemma3", vocab=320, hidden=64, inter=128, layers=6, heads=4, kv_heads=2, head_dim=16, tie=True,
                rope_theta=1e6, sliding_window=512, window_pattern=6, query_pre_attn_scalar=16, max_pos=8192 + 64,
                seed=23)
    model = llaisys_models.load(make_checkpoint(tmp_path, spec), device=device)
    p, new = ids(8192, "long"), 8
    params = greedy(new)
    (reference,), _, _ = run(model, [p], pool=keep_all(model, -(-(8192 + new) // BS)), params=params,
                             max_batch_tokens=512)
    pool = model.new_kv_pool(num_blocks=blocks_of(model, -(-(8192 + new) // BS)), block_size=BS)
    sched = Scheduler(model, pool, max_running=1, max_batch_tokens=512)
    seq = sched.add(p, params)
    held = 0
    while sched.has_work:
        plan = sched.schedule()
        held = pool.check()["used"]
        sched.commit(sched.runner.execute(plan))
    assert seq.tokens == reference
    context = -(-(8192 + new - 1) // BS)  # the blocks of the last step's positions (8199 of them)
    window = -(-(512 + WINDOW_READ_SLACK) // BS) + 1  # at most: the window, its key block, the block written
    assert context + 5 * 32 <= held <= context + 5 * window
    assert held * pool.bytes_per_block < keep_all(model, context).nbytes / 4
