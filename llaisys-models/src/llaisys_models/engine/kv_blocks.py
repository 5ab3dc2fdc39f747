"""The paged KV cache's bookkeeping, in plain Python: which block holds which positions of which sequence.

    blocks = BlockManager(num_blocks, block_size)   # no device: tests drive it directly
    seq = blocks.sequence(scope, adapter) # an empty block table (scope: whose prefix cache it may use; adapter:
                                          # the LoRA adapter its keys and values are computed under, or None)
    seq.adopt_prefix(prompt, limit)       # reuse cached blocks that hold the prompt's start
    seq.reserve(n)                        # blocks for n positions (False: the pool is out)
    child = seq.fork(n)                   # a second sequence sharing the first n positions' blocks
    ... a forward writes positions len(seq) .. n-1 ... seq.commit(new tokens)
    seq.release()                         # blocks back; cached ones stay findable
    seq.drop_outside_window()             # (a model whose every layer slides) blocks no layer reads any more back

The keys and values themselves live in ``kv_cache.KVPool``, a BlockManager that owns them and copies a
block's tensors in ``copy_block``.

Prefix sharing. A full block is indexed by (its parent, its token ids): the chain of parents makes the key
cover the whole prefix, and a dict lookup compares the token ids themselves, so a match is exact (no hash
collision can share the wrong keys). The parent of a sequence's first block is the root of its scope and
adapter: two scopes (tenants of a server) never see each other's blocks, and keys computed under one LoRA
adapter (or none) never serve a sequence under another. Sequences that start with the same tokens hold
the same blocks (reference counted). When a sequence ends, its last, partly filled block is kept too (as a
child of its parent), so a follow-up turn or an edited message reuses every token before the first
difference: the best-matching child block is copied into a new block of the sequence (copy on write) and
only the rest is computed. A block is written only by the sequence that owns it alone and has not indexed it.
Forking (n choices of one prompt) shares a sequence's full blocks with the new one and copies its partly
filled last block, so each writes its continuation into blocks of its own.

Freeing. A block whose count drops to 0 goes back to the free list, or — if indexed — to the cached list
(least recently released first), whose blocks are reused only when the free list is empty; taking one
unindexes it and everything indexed below it. Each block is always in exactly one state: in use (count > 0),
cached (count 0, indexed) or free (count 0, not indexed); ``check()`` verifies it.

Sliding windows. Where every layer of the model sees only its last ``window`` positions (Mistral, Phi-3, ...:
``BlockManager.window``, set by the model's ``new_kv_pool``), the blocks wholly before the window of a sequence's
next forward are never read again: ``drop_outside_window`` (the scheduler's, before each step) gives them back
and leaves ``DROPPED`` in their table entries (a sequence's first ``dropped`` blocks). Given back, an indexed
block stays cached under its parent like any released one; a block whose parent was given back before it filled
is not indexed (DROPPED is no parent) (docs/design/kv-cache.md, "Sliding windows"). Where global layers sit beside
sliding ones (Gemma 3), each group of layers has a table of its own (``GroupedSequenceKV``: a SequenceKV per group,
with that group's window), all in one manager, so the sliding groups give back while the global ones hold on.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Hashable, Sequence
from typing import Protocol

import llaisys


@dataclasses.dataclass(frozen=True)
class Root:
    """The parent of a sequence's first block: one per scope, LoRA adapter (its uid; 0: none) and layer group (a
    pool of several: kv_cache.py; each group's blocks hold other layers' keys, so each has its own chains)."""
    scope: str = ""
    adapter: int = 0
    group: int = 0


class Adapter(Protocol):
    """A LoRA adapter as the KV cache knows it (lora/adapter.py): a load's unique id."""
    uid: int


Parent = Hashable  # a block id (int) or a Root

# The table entry of a block a sequence gave back (``drop_outside_window``): no block, and no parent either
# (never indexed, so ``_reachable`` is False for it); the step inputs send block 0 for it, which no kernel reads.
DROPPED = -1
# paged_attention reads no key before the window of a sequence's first query row but the <= 64 keys of a
# kernel's key block that holds its first key (llaisys.ops.paged_attention): what stays held is counted from there
WINDOW_READ_SLACK = 64


class BlockManager:
    """Reference counts, free and cached lists and the prefix index of ``num_blocks`` blocks."""

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = True) -> None:
        if block_size < 1 or num_blocks < 1:
            raise llaisys.LlaisysValueError(f"a KV pool needs block_size >= 1 and num_blocks >= 1, got "
                                            f"{block_size} and {num_blocks}")
        self.block_size = block_size
        self.prefix_caching = prefix_caching  # may be switched at any time: read at each adopt / commit
        # the sliding window of every layer (positions), where the model's every layer slides; 0: some layer sees
        # every position, so no block is ever given back before its sequence ends (drop_outside_window)
        self.window = 0
        self.num_blocks = 0
        self._refs: list[int] = []
        self._free: collections.deque[int] = collections.deque()
        self._cached: collections.OrderedDict[int, None] = collections.OrderedDict()  # LRU first
        self._index: dict[tuple, int] = {}  # (parent, token ids) of a full block -> block
        self._entry: dict[int, tuple[Parent, tuple[int, ...]]] = {}  # indexed block -> (parent, token ids)
        self._children: dict[Parent, set[int]] = {}  # indexed parent (or a Root) -> indexed blocks below it
        self.add_blocks(num_blocks)

    def add_blocks(self, num_blocks: int) -> None:
        """Have ``num_blocks`` blocks in all (the new ones free)."""
        if num_blocks > self.num_blocks:
            self._free.extend(range(self.num_blocks, num_blocks))
            self._refs.extend([0] * (num_blocks - self.num_blocks))
            self.num_blocks = num_blocks

    @property
    def num_groups(self) -> int:
        """Block tables a sequence has: one (a KVPool of several layer groups: one per group)."""
        return 1

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def gives_back(self) -> bool:
        """Whether sequences give blocks back as they grow (sliding windows): their prompts are then reserved
        chunk by chunk, as they are read (the scheduler)."""
        return bool(self.window)

    def sequence(self, scope: str = "", adapter: Adapter | None = None) -> SequenceKV:
        return SequenceKV(self, scope, adapter)

    def copy_block(self, dst: int, src: int) -> None:
        """Copy block ``src``'s keys and values into ``dst`` (copy on write): the pool's tensors do (kv_cache)."""

    # -- blocks ------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks a sequence can take now (free, or cached and evictable)."""
        return len(self._free) + len(self._cached)

    def allocate(self) -> int | None:
        """A block for one owner (count 1), or None when every block is in use."""
        if self._free:
            block = self._free.popleft()
        elif self._cached:
            block, _ = self._cached.popitem(last=False)
            self._unindex(block)
        else:
            return None
        self._refs[block] = 1
        return block

    def incref(self, block: int) -> None:
        if self._refs[block] == 0:
            self._cached.pop(block)  # a cached block comes back into use (free blocks are never shared)
        self._refs[block] += 1

    def decref(self, block: int) -> None:
        if self._refs[block] <= 0:
            raise RuntimeError(f"KV block {block} released more often than it was taken")
        self._refs[block] -= 1
        if self._refs[block] == 0:
            if block in self._entry:
                self._cached[block] = None  # most recently released last
            else:
                self._free.append(block)

    def refcount(self, block: int) -> int:
        return self._refs[block]

    # -- the prefix index ---------------------------------------------------------------------

    def _add_entry(self, block: int, parent: Parent, tokens: tuple[int, ...]) -> None:
        self._entry[block] = (parent, tokens)
        self._children.setdefault(parent, set()).add(block)
        if len(tokens) == self.block_size:
            self._index[(parent, tokens)] = block

    def _reachable(self, parent: Parent) -> bool:
        return isinstance(parent, Root) or parent in self._entry

    def _unindex(self, block: int) -> None:
        """Forget block's entry and, recursively, the entries below it (their prefix is gone). A block
        below that is still in use stays with its owners, unindexed; cached ones become free."""
        parent, tokens = self._entry.pop(block)
        if self._index.get((parent, tokens)) == block:
            del self._index[(parent, tokens)]
        siblings = self._children.get(parent)
        if siblings is not None:
            siblings.discard(block)
            if not siblings:
                del self._children[parent]
        for child in list(self._children.get(block, ())):
            if self._refs[child] == 0:
                self._cached.pop(child)
                self._free.append(child)
            self._unindex(child)
        self._children.pop(block, None)

    def is_indexed(self, block: int) -> bool:
        return block in self._entry

    def index_full(self, block: int, parent: Parent, tokens: tuple[int, ...]) -> int:
        """Index a block that just became full; returns the block standing for this content: ``block``, or
        an earlier block with the same parent and tokens (the caller then uses that one)."""
        if not self._reachable(parent):
            return block  # below an unindexed block: unreachable, keep it private
        existing = self._index.get((parent, tokens))
        if existing is not None:
            return existing
        if block not in self._entry:
            self._add_entry(block, parent, tokens)
        return block

    def index_partial(self, block: int, parent: Parent, tokens: tuple[int, ...]) -> None:
        """Keep a sequence's last, partly filled block findable after the sequence ends."""
        if tokens and block not in self._entry and self._reachable(parent):
            self._add_entry(block, parent, tokens)

    def match(self, tokens: list[int], limit: int, root: Root = Root()) -> tuple[list[int], int | None, int]:
        """Cached blocks under ``root`` (a scope and adapter) holding the longest prefix of ``tokens[:limit]``:
        (full blocks, a block whose first ``n`` positions continue it (to copy), n)."""
        bs, start = self.block_size, 0
        parent: Parent = root
        full: list[int] = []
        while start + bs <= limit:
            block = self._index.get((parent, tuple(tokens[start:start + bs])))
            if block is None:
                break
            full.append(block)
            parent, start = block, start + bs
        best, best_n = None, 0
        window = tokens[start:min(start + bs, limit)]
        for child in self._children.get(parent, ()):
            n = _common_prefix(self._entry[child][1], window)
            if n > best_n:
                best, best_n = child, n
        return full, best, best_n

    # -- accounting -------------------------------------------------------------------------------

    def check(self) -> dict[str, int]:
        """Verify that every block is in exactly one state; return the counts (used, cached, free)."""
        free, cached = set(self._free), set(self._cached)
        if len(free) != len(self._free):
            raise AssertionError("a block is on the free list twice")
        used = {b for b in range(self.num_blocks) if self._refs[b] > 0}
        if any(r < 0 for r in self._refs):
            raise AssertionError("a negative reference count")
        if free & cached or used & (free | cached) or len(used | free | cached) != self.num_blocks:
            raise AssertionError(f"blocks in two states or none: used {len(used)}, cached {len(cached)}, "
                                 f"free {len(free)} of {self.num_blocks}")
        if any(b in self._entry for b in free) or any(b not in self._entry for b in cached):
            raise AssertionError("the free list holds an indexed block, or the cached list an unindexed one")
        return {"used": len(used), "cached": len(cached), "free": len(free)}

    def stats(self) -> dict[str, int]:
        used = sum(1 for r in self._refs if r > 0)
        return {"blocks": self.num_blocks, "used": used, "cached": len(self._cached), "free": len(self._free)}


class SequenceKV:
    """One sequence's block table and the token ids whose keys/values are stored, in ``scope``, computed under
    ``adapter`` (a LoRA adapter, or None: the base model's)."""

    def __init__(self, blocks: BlockManager, scope: str = "", adapter: Adapter | None = None, *,
                 window: int | None = None, group: int = 0) -> None:
        self.manager = blocks
        self.scope = scope
        self.adapter = adapter
        self.group = group  # (of a pool's layer groups: the block table of those layers)
        self.root = Root(scope, 0 if adapter is None else adapter.uid, group)
        # the sliding window of every layer this table serves (0: some sees every position); the pool's by default
        self.window = blocks.window if window is None else window
        self.blocks: list[int] = []
        self.tokens: list[int] = []
        self.dropped = 0  # leading blocks given back (drop_outside_window): DROPPED in ``blocks``

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def parts(self) -> tuple[SequenceKV, ...]:
        """The block table of each layer group (GroupedSequenceKV has several; this is one)."""
        return (self,)

    def _parent(self, b: int) -> Parent:
        """The index parent of the sequence's block ``b`` (DROPPED, never reachable, after a dropped block)."""
        return self.blocks[b - 1] if b else self.root

    def _window_start(self, length: int) -> int:
        """The first position a forward from ``length`` on may read: the window of its first query, less the
        key block a kernel reads it in (0: every position, or no window)."""
        window = self.window
        if not window:
            return 0
        first = max(length - window + 1, 0)
        return first // WINDOW_READ_SLACK * WINDOW_READ_SLACK

    def drop_outside_window(self) -> int:
        """Give back the blocks wholly before every layer's window of the next forward (which starts at
        ``len(self)``): the sequence's ``window`` (0: nothing to give back). Their entries become DROPPED. Returns how
        many blocks were given back. Only a caller that never cuts the sequence back past the start of its next
        forward may call it (the scheduler: a rejected draft is cut back to its step's start at the earliest)."""
        upto = min(self._window_start(len(self.tokens)) // self.manager.block_size, len(self.blocks))
        if upto <= self.dropped:
            return 0
        for b in range(self.dropped, upto):  # oldest first: a cached prefix is evicted from its start
            self.manager.decref(self.blocks[b])
            self.blocks[b] = DROPPED
        given, self.dropped = upto - self.dropped, upto
        return given

    def blocks_for(self, length: int) -> int:
        """New blocks needed to hold ``length`` positions."""
        return max(-(-length // self.manager.block_size) - len(self.blocks), 0)

    def reserve(self, length: int) -> bool:
        """Blocks for ``length`` positions in all; False (taking nothing) when the pool has too few."""
        need = self.blocks_for(length)
        if need > self.manager.num_free:
            return False
        for _ in range(need):
            block = self.manager.allocate()
            assert block is not None  # (no more than the free blocks: checked above)
            self.blocks.append(block)
        return True

    def adopt_prefix(self, tokens: list[int], limit: int) -> int:
        """Start an empty sequence from the cached blocks that hold the longest prefix of
        ``tokens[:limit]``; returns how many positions were reused (the rest must be computed)."""
        if self.blocks:
            raise RuntimeError("adopt_prefix needs an empty sequence")
        m = self.manager
        if not m.prefix_caching or limit <= 0:
            return 0
        full, source, n = m.match(tokens, limit, self.root)
        for block in full:
            m.incref(block)
        self.blocks = list(full)
        self.tokens = list(tokens[:len(full) * m.block_size])
        if source is not None:
            m.incref(source)  # keep it while a block is taken for the copy
            copy = m.allocate()
            if copy is not None:
                m.copy_block(copy, source)
                self.blocks.append(copy)
                self.tokens.extend(tokens[len(self.tokens):len(self.tokens) + n])
            m.decref(source)
        return len(self.tokens)

    def fork(self, length: int) -> SequenceKV | None:
        """A new sequence of this scope holding this one's first ``length`` positions: their full blocks shared
        (reference counted), a partly filled last block copied (copy on write, so both may go on writing).
        None, taking nothing, when no block is free for the copy."""
        if not 0 < length <= len(self.tokens):
            raise ValueError(f"cannot fork {length} positions of a sequence of {len(self.tokens)}")
        m, bs = self.manager, self.manager.block_size
        child = SequenceKV(m, self.scope, self.adapter, window=self.window, group=self.group)
        full = length // bs
        copied: list[int] = []  # the partly filled last block's copy
        if length % bs:
            copy = m.allocate()
            if copy is None:
                return None
            m.copy_block(copy, self.blocks[full])
            copied = [copy]
        for block in self.blocks[:full]:
            if block != DROPPED:
                m.incref(block)
        child.blocks = self.blocks[:full] + copied
        child.tokens = self.tokens[:length]
        child.dropped = min(self.dropped, full)  # (its next forward, at length, reads none of them either)
        return child

    def commit(self, new_tokens: list[int]) -> None:
        """Record that the keys/values of ``new_tokens`` were written after the stored ones. Blocks that
        became full are indexed for sharing; one whose content another block already holds is swapped
        for that block (the same keys and values), so a sequence always holds its whole chain of parents."""
        m, bs = self.manager, self.manager.block_size
        start = len(self.tokens)
        self.tokens.extend(new_tokens)
        if not m.prefix_caching:
            return
        for b in range(start // bs, len(self.tokens) // bs):
            block = self.blocks[b]
            standing = m.index_full(block, self._parent(b), tuple(self.tokens[b * bs:(b + 1) * bs]))
            if standing != block:
                m.incref(standing)
                m.decref(block)
                self.blocks[b] = standing

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions. A kept, partly filled last block that others share or that
        is indexed is replaced by a private copy before anything writes into it."""
        if not 0 <= length <= len(self.tokens):
            raise ValueError(f"cannot truncate a sequence of {len(self.tokens)} tokens to {length}")
        m, bs = self.manager, self.manager.block_size
        if self.dropped and self._window_start(length) < self.dropped * bs:
            raise RuntimeError(f"cannot cut the sequence back to {length} positions: the blocks before position "
                               f"{self.dropped * bs}, which its windows would read, were given back")
        keep = -(-length // bs)
        for block in reversed(self.blocks[keep:]):
            m.decref(block)
        del self.blocks[keep:], self.tokens[length:]
        if length % bs:
            last = self.blocks[-1]
            if m.refcount(last) > 1 or m.is_indexed(last):
                copy = m.allocate()
                if copy is None:  # no block for the copy: drop the partial block (recomputed later)
                    m.decref(last)
                    del self.blocks[-1], self.tokens[length - length % bs:]
                else:
                    m.copy_block(copy, last)
                    m.decref(last)
                    self.blocks[-1] = copy

    def release(self) -> None:
        """Give every block back. Indexed blocks stay cached; the last, partly filled one is indexed too
        (when prefix caching is on), so the next turn of the conversation finds it."""
        m, bs = self.manager, self.manager.block_size
        if m.prefix_caching and len(self.tokens) % bs and len(self.blocks) > len(self.tokens) // bs:
            b = len(self.tokens) // bs
            m.index_partial(self.blocks[b], self._parent(b), tuple(self.tokens[b * bs:]))
        for block in reversed(self.blocks[self.dropped:]):  # the last first: cached leaves are evicted before parents
            m.decref(block)
        self.blocks, self.tokens, self.dropped = [], [], 0


class GroupedSequenceKV:
    """One sequence of a pool whose layers are in several groups (kv_cache.LayerGroup: Gemma 3's global layers
    and its sliding ones), each group's keys and values in blocks of its own: a SequenceKV per group (``parts``),
    all in the one manager, the sliding groups' windows giving their blocks back as the sequence grows. Every
    method is SequenceKV's, over every part, and every part always holds the same positions."""

    def __init__(self, blocks: BlockManager, windows: Sequence[int], scope: str = "",
                 adapter: Adapter | None = None) -> None:
        self.manager = blocks
        self.scope, self.adapter = scope, adapter
        self.parts = tuple(SequenceKV(blocks, scope, adapter, window=w, group=g) for g, w in enumerate(windows))

    def __len__(self) -> int:
        return len(self.parts[0])

    @property
    def tokens(self) -> list[int]:
        return self.parts[0].tokens

    def blocks_for(self, length: int) -> int:
        return sum(part.blocks_for(length) for part in self.parts)

    def reserve(self, length: int) -> bool:
        """Blocks for ``length`` positions in every group, or (too few free) none taken."""
        if self.blocks_for(length) > self.manager.num_free:
            return False
        for part in self.parts:
            taken = part.reserve(length)
            assert taken  # (the free blocks cover every part's: checked above)
        return True

    def drop_outside_window(self) -> int:
        return sum(part.drop_outside_window() for part in self.parts)

    def adopt_prefix(self, tokens: list[int], limit: int) -> int:
        """The longest prefix every group holds cached (a group's chain may have lost a block another kept)."""
        reused = min(part.adopt_prefix(tokens, limit) for part in self.parts)
        self._cut_to(reused)
        return len(self)

    def fork(self, length: int) -> GroupedSequenceKV | None:
        children: list[SequenceKV] = []
        for part in self.parts:
            child = part.fork(length)
            if child is None:  # no block for a copy: give back what the others took
                for taken in children:
                    taken.release()
                return None
            children.append(child)
        fork = GroupedSequenceKV(self.manager, (), self.scope, self.adapter)
        fork.parts = tuple(children)
        return fork

    def commit(self, new_tokens: list[int]) -> None:
        for part in self.parts:
            part.commit(new_tokens)

    def truncate(self, length: int) -> None:
        for part in self.parts:
            part.truncate(length)
        self._cut_to(len(self))

    def _cut_to(self, length: int) -> None:
        """Every part back to ``length`` positions (a part that could not copy its partial last block on
        ``truncate`` dropped it: the others follow, so every part holds the same positions)."""
        length = min(length, *(len(part) for part in self.parts))
        while any(len(part) != length for part in self.parts):
            for part in self.parts:
                part.truncate(length)
            length = min(len(part) for part in self.parts)

    def release(self) -> None:
        for part in self.parts:
            part.release()


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
