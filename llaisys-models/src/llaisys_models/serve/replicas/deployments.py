"""The Ray Serve application: an ingress and the replicas of the engine behind it.

    client ─HTTP─> Ray Serve's proxy ─> LlaisysIngress (one; forwarding.Relay)
                                          │ handle.respond, routed by router.PrefixAwareRouter
                                          v
                       LlaisysReplica × N (each: a model, its engine and the single server's FastAPI app)

A replica builds exactly what ``llaisys serve`` builds in one process (``launch.load_server``: the model, its
engine, ``server.Server``; ``app.create_app``), from the same options, and answers the requests the ingress
forwards with that app: the OpenAI API, its errors, API keys (the replicas know the keys' digests only), the
``Host`` check and CORS are the single server's. Ray Serve restarts a replica whose engine died (its health
check fails) or whose process did, and scales their number between the autoscaling bounds.

A tensor-parallel replica (``--tensor-parallel N``) reserves a placement group of one bundle per rank
(``placement_group_bundles``; Serve places the replica in bundle 0): its ``load_server`` starts ranks 1 .. N-1 as
Ray actors in bundles 1 .. N-1 (tensor_parallel/ray_ranks.py), this process being rank 0 and running the engine.
A rank that dies ends the group, the engine stops, the health check fails and Serve replaces the replica (the
rank actors end with it: they are its own).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ray import serve
from ray.serve.config import RequestRouterConfig

from ..app import create_app
from ..request_body import MAX_BODY_BYTES
from ..tenancy import Tenants
from .forwarding import Relay, respond
from .ray_metrics import RayMetrics, exported
from .router import PrefixAwareRouter

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle
    from starlette.types import Message

    from .forwarding import ForwardedRequest

APP_NAME = "llaisys"
REPLICA, INGRESS = "LlaisysReplica", "LlaisysIngress"
HEALTH_CHECK_PERIOD_S = 5.0  # (a check reads one flag: cheap; a dead replica is replaced within about this long)
HEALTH_CHECK_TIMEOUT_S = 30.0
UNBOUNDED = 1 << 30  # requests in flight at once: the engine queues what it cannot run yet (429 past its queue)


class LlaisysReplica:
    """One engine and the single server's app over it. ``options``: ``llaisys serve``'s options (argparse's
    names and values) with ``path`` (the model), ``kv_memory`` (bytes or None), ``key_digests`` (the API keys'
    SHA-256) and ``port`` (where clients reach the application)."""

    # Ray Serve awaits a deployment's async __init__ (its async constructors); Python's data model, which mypy
    # checks, has no such thing: __init__ must return None
    async def __init__(self, options: dict[str, Any]) -> None:  # type: ignore[misc]
        from ..launch import load_server

        args = argparse.Namespace(**options)
        # (on a thread: loading takes seconds to minutes, and the replica's event loop goes on meanwhile)
        server = await asyncio.to_thread(load_server, args, args.path, args.kv_memory, Tenants(args.key_digests),
                                         args.port)
        context = serve.get_replica_context()
        self.replica = context.replica_id.unique_id
        self._metrics = asyncio.create_task(RayMetrics(server.engine, server.model_name).run())
        # GET /metrics (the app's route: its key and Host checks) answers with every replica's, from Ray's export
        server.metrics_text = functools.partial(exported, context.app_name)
        self.server, self.app = server, create_app(server)
        self._lifespan = self.app.router.lifespan_context(self.app)
        await self._lifespan.__aenter__()  # the app's own start-up: the engine thread starts

    async def respond(self, request: ForwardedRequest) -> AsyncIterator[list[Message]]:
        """A forwarded HTTP request (``forwarding.ForwardedRequest``) through the app: lists of ASGI messages."""
        async for batch in respond(self.app, request, self.replica):
            yield batch

    def check_health(self) -> None:
        """Ray Serve calls this every health check period: an error marks the replica unhealthy (then replaced).
        A tensor-parallel replica whose group has failed (a rank died or hung) is unhealthy at once, before a
        request finds out."""
        engine = self.server.engine
        if not engine.alive:
            raise RuntimeError(engine.error or "the engine is not running")
        followers = engine.model.followers
        if followers is not None and followers.failure is not None:
            raise RuntimeError(followers.failure)

    async def __del__(self) -> None:  # Ray Serve calls it when it stops the replica
        self._metrics.cancel()
        with contextlib.suppress(Exception):
            await self._lifespan.__aexit__(None, None, None)  # the app's own shutdown: the engine stops


@serve.ingress()
class LlaisysIngress:
    """Forwards every HTTP request to a replica (``forwarding.Relay``) through ``replicas``, their handle."""

    def __init__(self, replicas: DeploymentHandle, key_digests: tuple[bytes, ...],
                 max_body_bytes: int = MAX_BODY_BYTES) -> None:
        handle = replicas.options(method_name="respond", stream=True)
        self._relay = Relay(handle, Tenants(key_digests), max_body_bytes)

    def __serve_build_asgi_app__(self) -> Relay:
        return self._relay


def application(options: dict[str, Any], scaling: dict[str, Any], replica_resources: dict[str, Any],
                bundles: list[dict[str, float]] | None = None,
                health_check_period_s: float = HEALTH_CHECK_PERIOD_S) -> serve.Application:
    """The bound Ray Serve application: replicas built from ``options`` (see ``LlaisysReplica``), as many as
    ``scaling`` says (``launch.scaling_options``), each reserving ``replica_resources`` (num_cpus, num_gpus), or
    with ``bundles`` a placement group (tensor-parallel replicas: ``launch.replica_bundles``)."""
    placement: dict[str, Any] = ({} if bundles is None else
                                 {"placement_group_bundles": bundles, "placement_group_strategy": "PACK"})
    replica = serve.deployment(LlaisysReplica, name=REPLICA, **scaling, **placement,
                               max_ongoing_requests=UNBOUNDED, ray_actor_options=replica_resources,
                               health_check_period_s=health_check_period_s,
                               health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S,
                               request_router_config=RequestRouterConfig(
                                   request_router_class=PrefixAwareRouter,
                                   request_router_kwargs={"imbalanced_threshold": options["max_running"]}))
    # the ingress needs no core of its own (it relays bytes); one, so that one prefix index sees every request
    ingress = serve.deployment(LlaisysIngress, name=INGRESS, num_replicas=1, max_ongoing_requests=UNBOUNDED,
                               ray_actor_options={"num_cpus": 0})
    return ingress.bind(replica.bind(options), tuple(options["key_digests"]))
