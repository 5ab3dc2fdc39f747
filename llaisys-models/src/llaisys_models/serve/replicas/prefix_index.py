"""Which replica was sent which prompt, per cache scope: what the prefix-aware router remembers.

One radix tree per cache scope (a tenant: its API key's digest, plus a ``cache_salt``) over routing texts
(``routing.py``). Each node records the replicas that were sent a text running through it, and when; the
deepest node a new text reaches names the replicas whose KV cache most likely holds its longest prefix (an
engine caches what it computed, within the request's scope). Trees of different scopes never meet, so one
tenant's prompts neither steer nor reveal anything about another's routing.

Memory is bounded as the engines' caches are: a replica's share (the characters of the nodes that record it)
is at most ``max_chars``; past that its least recently used nodes are forgotten until it holds ``keep_chars``.
A node is used whenever a text through it is sent, so a node is never more recent than its parent, and
forgetting the oldest (deepest first among equals) never leaves a replica on a node below one it left.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Collection, Iterator


class _Node:
    __slots__ = ("edge", "parent", "children", "seen")

    def __init__(self, edge: str, parent: _Node | None) -> None:
        self.edge = edge  # the characters from the parent to this node (a root: its tree's cache scope)
        self.parent = parent
        self.children: dict[str, _Node] = {}  # by the first character of their edge
        self.seen: dict[str, int] = {}  # replica -> when a text through this node was last sent to it

    def depth(self) -> int:
        node, depth = self, 0
        while node.parent is not None:
            node, depth = node.parent, depth + 1
        return depth


def _common_length(edge: str, text: str, start: int) -> int:
    """How many leading characters of ``edge`` match ``text`` from ``start``."""
    n = min(len(edge), len(text) - start)
    i = 0
    while i < n and edge[i] == text[start + i]:
        i += 1
    return i


class PrefixIndex:
    def __init__(self, max_chars: int = 1 << 20, keep_chars: int | None = None) -> None:
        if max_chars < 1:
            raise ValueError(f"max_chars must be >= 1, got {max_chars}")
        self.max_chars = max_chars
        self.keep_chars = max_chars * 9 // 10 if keep_chars is None else keep_chars
        self._roots: dict[str, _Node] = {}  # by cache scope
        self._chars: collections.Counter[str] = collections.Counter()  # each replica's share
        self._clock = itertools.count(1)  # a use's time: strictly increasing, so no two uses tie

    def chars(self, replica: str) -> int:
        """The characters of text remembered as sent to ``replica``."""
        return self._chars[replica]

    def match(self, scope: str, text: str, replicas: Collection[str]) -> tuple[int, list[str]]:
        """(characters of ``text`` matched, the replicas among ``replicas`` that were sent that prefix) for the
        longest prefix of ``text`` that one of ``replicas`` was sent in ``scope``; (0, []) when none was."""
        node = self._roots.get(scope)
        matched, holders = 0, []
        while node is not None and matched < len(text):
            child = node.children.get(text[matched])
            if child is None:
                break
            live = [r for r in child.seen if r in replicas]
            if not live:
                break
            common = _common_length(child.edge, text, matched)
            matched, holders = matched + common, live
            node = child if common == len(child.edge) else None
        return matched, holders

    def insert(self, scope: str, text: str, replica: str) -> None:
        """Remember that ``text`` was sent to ``replica`` in ``scope`` (then forget its oldest past the bound)."""
        if not text:
            return
        now = next(self._clock)
        node = self._roots.get(scope) or self._roots.setdefault(scope, _Node(scope, None))  # a root's edge: its scope
        i = 0
        while i < len(text):
            child = node.children.get(text[i])
            if child is None:
                child = node.children[text[i]] = _Node(text[i:], node)
            else:
                common = _common_length(child.edge, text, i)
                if common < len(child.edge):  # split: the shared part becomes a node of its own
                    child = self._split(child, common)
            self._use(child, replica, now)
            i += len(child.edge)
            node = child
        if self._chars[replica] > self.max_chars:
            self._forget_oldest(replica, self.keep_chars)

    def remove(self, replica: str) -> None:
        """Forget everything sent to ``replica`` (it stopped, or died)."""
        self._forget_oldest(replica, 0)
        del self._chars[replica]

    # -- internals ----------------------------------------------------------------------

    def _use(self, node: _Node, replica: str, now: int) -> None:
        if replica not in node.seen:
            self._chars[replica] += len(node.edge)
        node.seen[replica] = now

    @staticmethod
    def _split(node: _Node, at: int) -> _Node:
        """Cut ``node``'s edge after ``at`` characters; the new upper node (returned) records what ``node`` did."""
        parent = node.parent
        assert parent is not None
        upper = _Node(node.edge[:at], parent)
        upper.seen = dict(node.seen)
        parent.children[node.edge[0]] = upper
        node.edge, node.parent = node.edge[at:], upper
        upper.children[node.edge[0]] = node
        return upper

    def _nodes(self) -> Iterator[_Node]:
        for root in self._roots.values():
            stack = list(root.children.values())
            while stack:
                node = stack.pop()
                yield node
                stack.extend(node.children.values())

    def _forget_oldest(self, replica: str, keep: int) -> None:
        """Take ``replica`` off its least recently used nodes until it holds at most ``keep`` characters."""
        held = sorted((node for node in self._nodes() if replica in node.seen),
                      key=lambda node: (node.seen[replica], -node.depth()))
        for node in held:
            if self._chars[replica] <= keep:
                break
            del node.seen[replica]
            self._chars[replica] -= len(node.edge)
            self._prune(node)

    def _prune(self, node: _Node) -> None:
        """Drop ``node`` if no replica records it (then none records its subtree either), and an empty tree."""
        if node.seen or node.parent is None:
            return
        parent = node.parent
        del parent.children[node.edge[0]]
        if parent.parent is None and not parent.children:
            del self._roots[parent.edge]
