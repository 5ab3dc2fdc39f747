"""The prefix-aware request router: Ray Serve's ``RequestRouter``, on the ingress's handle to the replicas.

As Ray Serve LLM's ``PrefixCacheAffinityRouter`` does, for each request with a route (``routing.py``):

1. if the replicas' queues are balanced (the longest minus the shortest at most ``imbalanced_threshold``),
2. and a replica was sent a prefix of the request's text in its cache scope (``PrefixIndex``) that makes up at
   least ``match_rate_threshold`` of the text (for chat, whole messages: ``routing.Route.boundary``),
3. the request goes to that replica (the least loaded of them if several), or, should they all be full, to the
   least loaded of two others picked at random;

otherwise (no route, imbalanced queues, no prefix long enough) to the least loaded of two replicas picked at
random ("power of two choices", Ray Serve's default). The text is remembered for the replica that accepted the
request; a replica that stops or dies is forgotten.

Unlike Ray Serve LLM's, a request without a long enough prefix does not go to the replica whose remembered
text is shortest: requests arriving together would all pick that one replica (a request's text is remembered
only once a replica has accepted it), while the queue lengths the two-choices rule reads count each request
as soon as it is sent.

Each ingress replica has its own router and index (the deployment runs one ingress replica; Ray Serve LLM
shares one index among routers in an actor, at a remote call per request).
"""

from __future__ import annotations

import random

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica
from ray.util.metrics import Counter

from .prefix_index import PrefixIndex
from .routing import Route


class PrefixAwareRouter(RequestRouter):
    def initialize_state(self, imbalanced_threshold: float = 16, match_rate_threshold: float = 0.1,
                         max_chars_per_replica: int = 1 << 20) -> None:
        """Keyword arguments: the deployment's ``request_router_kwargs``."""
        self._imbalanced_threshold = imbalanced_threshold
        self._match_rate_threshold = match_rate_threshold
        self._index = PrefixIndex(max_chars_per_replica)
        self._routes = Counter("llaisys_router_choices", "The router's choices of replicas for a request, by what "
                               "chose: 'prefix' (the replicas holding its prefix) or 'load' (two at random, the less "
                               "loaded taken).", ("by",))

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        route = _route_of(pending_request)
        if route is not None and len(candidate_replicas) > 1 and self._balanced(candidate_replicas):
            by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
            matched, holders = self._index.match(route.scope, route.text, by_id)
            whole = route.whole(matched)
            if whole < matched:  # (every replica sent the shorter prefix holds it, not only those sent the longer)
                matched, holders = self._index.match(route.scope, route.text[:whole], by_id)
            if holders and matched >= self._match_rate_threshold * len(route.text):
                others = [r for rid, r in by_id.items() if rid not in holders]
                self._routes.inc(tags={"by": "prefix"})
                return [[by_id[rid] for rid in holders]] + ([_two_at_random(others)] if others else [])
        if pending_request is not None:
            self._routes.inc(tags={"by": "load"})
        return [_two_at_random(candidate_replicas)]

    def _balanced(self, replicas: list[RunningReplica]) -> bool:
        """Whether the queues the router knows of (sent minus finished requests, refreshed by the replicas' replies)
        differ by at most the threshold."""
        lengths = [n for n in (self.replica_queue_len_cache.get(r.replica_id) for r in replicas) if n is not None]
        return not lengths or max(lengths) - min(lengths) <= self._imbalanced_threshold

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, _result: object) -> None:
        route = _route_of(pending_request)
        if route is not None:
            self._index.insert(route.scope, route.text, replica_id.unique_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        gone = set(self.curr_replicas) - {r.replica_id for r in replicas}
        super().update_replicas(replicas)
        for replica_id in gone:
            self._index.remove(replica_id.unique_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._index.remove(replica_id.unique_id)


def _route_of(pending_request: PendingRequest | None) -> Route | None:
    """The route a forwarded request carries (``forwarding.ForwardedRequest.route``), if any."""
    if pending_request is None or not pending_request.args:
        return None
    route = getattr(pending_request.args[0], "route", None)
    return route if isinstance(route, Route) else None


def _two_at_random(replicas: list[RunningReplica]) -> list[RunningReplica]:
    return random.sample(replicas, min(2, len(replicas)))
