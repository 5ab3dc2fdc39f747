"""Replicas of the server on Ray Serve (serve/replicas; the ray extra), on a local Ray cluster of two nodes on
127.0.0.1 with one replica each, built as Ray's own ``serve run`` builds it (``ray_app.build_app``):

- eight chats at once, greedy and seeded, streamed and not, through the official client: the same text as the
  single server (``chat_server``), spread over both replicas;
- each chat's next turn goes to the replica that holds its prefix (its cached tokens > 0);
- the API is the single server's: API keys, the Host check, CORS, OpenAI's error bodies;
- every replica's engine metrics reach Ray's Prometheus export; a client that hangs up cancels its request there;
- killing a replica's process loses no request that had not started streaming, and Ray starts a new replica.

The cluster (tests/ray_cluster.py: small object stores, no dashboard, one CPU per node) is shared with the
other modules that need one.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import socket
import threading
import urllib.request

import pytest

from helpers.ray_cluster import LOOPBACK, processes_titled
from helpers.serve_helpers import CHAT_MODEL, TIMEOUT, at_once, http_request, require_serving, user, wait_until

require_serving()
if importlib.util.find_spec("ray") is None:
    pytest.skip("Ray is not installed: pip install 'llaisys-models[ray]'", allow_module_level=True)

import openai  # noqa: E402

pytestmark = pytest.mark.slow  # a minute of CPU: a Ray cluster and its Serve application start

KEYS = ("key-of-tenant-a", "key-of-tenant-b")
ORIGIN = "https://app.example"
QUIET = {"log_level": "WARNING", "enable_access_log": False}
REPLICA_PROCESS = b"ray::ServeReplica:llaisys:LlaisysReplica"  # a replica's process title


@pytest.fixture(scope="module")
def cluster(ray_cluster):
    """Two Ray nodes on 127.0.0.1, one CPU each (so one replica each): tests/ray_cluster.py."""
    return ray_cluster.start()


class Replicas:
    def __init__(self, port: int):
        self.base_url = f"http://{LOOPBACK}:{port}"

    def client(self, key: str = KEYS[0]) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=key, max_retries=0, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def replicas(cluster, chat_model_dir, tmp_path_factory):
    from ray import serve

    from llaisys_models.serve.ray_app import build_app
    from llaisys_models.serve.replicas.deployments import APP_NAME

    key_file = tmp_path_factory.mktemp("replicas") / "keys"
    key_file.write_text("\n".join(KEYS) + "\n")
    port = free_port()
    serve.start(http_options={"host": LOOPBACK, "port": port}, proxy_location="HeadOnly", logging_config=QUIET)
    app = build_app({"model": str(chat_model_dir), "replicas": "2", "served-model-name": CHAT_MODEL,
                     "max-running": "8", "kv-memory": "64MiB", "port": str(port), "api-key-file": str(key_file),
                     "cors-origin": ORIGIN})
    serve.run(app, name=APP_NAME, route_prefix="/", logging_config=QUIET)
    yield Replicas(port)
    serve.shutdown()  # (the cluster's cores are free for the next module that uses it)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


# -- eight chats at once, then their next turns ------------------------------------------------------------------

GREEDY, SEEDED = {"temperature": 0}, {"temperature": 0.9, "top_p": 0.95}


def chat_request(i: int) -> dict:
    sampling = GREEDY if i % 2 == 0 else {**SEEDED, "seed": 100 + i}
    return {"model": CHAT_MODEL, "messages": user(f"Conversation {i}: tell me about {'abcdefgh'[i]}."),
            "max_tokens": 24, **sampling}


def ask(client: openai.OpenAI, request: dict, stream: bool) -> tuple[str, str, object]:
    """(the reply's text, the replica that answered, the usage)."""
    if stream:
        raw = client.chat.completions.with_raw_response.create(stream=True, stream_options={"include_usage": True},
                                                               **request)
        chunks = list(raw.parse())
        text, usage = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks[-1].usage
    else:
        raw = client.chat.completions.with_raw_response.create(**request)
        reply = raw.parse()
        text, usage = reply.choices[0].message.content, reply.usage
    return text, raw.headers.get("x-llaisys-replica"), usage


@pytest.fixture(scope="module")
def first_turns(replicas):
    """The eight chats (tenant a's and b's, streamed and not), at once: [(request, text, replica, usage)]."""
    requests = [chat_request(i) for i in range(8)]
    results = at_once([lambda i=i: ask(replicas.client(KEYS[i % 2]), requests[i], stream=i % 4 < 2)
                       for i in range(8)])
    return [(request, *result) for request, result in zip(requests, results)]


def test_chats_at_once_equal_a_single_servers(first_turns, chat_server):
    single = chat_server.client()
    for request, text, _, usage in first_turns:
        assert text == ask(single, request, stream=False)[0], request
        assert usage.completion_tokens == 24
    assert len({replica for _, _, replica, _ in first_turns}) == 2  # both replicas served


def test_a_next_turn_goes_to_the_replica_with_its_prefix(replicas, first_turns, chat_server):
    for i, (request, text, replica, _) in enumerate(first_turns):
        messages = request["messages"] + [{"role": "assistant", "content": text}, {"role": "user", "content": "Go on."}]
        follow_up = {**request, "messages": messages}
        reply, served_by, usage = ask(replicas.client(KEYS[i % 2]), follow_up, stream=i % 2 == 0)
        assert served_by == replica, f"conversation {i} moved from replica {replica} to {served_by}"
        assert usage.prompt_tokens_details.cached_tokens > 0
        assert reply == ask(chat_server.client(), follow_up, stream=False)[0]


# -- the single server's API, through the ingress ---------------------------------------------------------------

CHAT = "/v1/chat/completions"
CHAT_BODY = {"model": CHAT_MODEL, "messages": user("Hi"), "max_tokens": 2}
BEARER_A = {"Authorization": f"Bearer {KEYS[0]}"}


@pytest.mark.parametrize("method, path, body, headers, status, code", [
    ("POST", CHAT, CHAT_BODY, {}, 401, "invalid_api_key"),
    ("POST", CHAT, CHAT_BODY, {"Authorization": "Bearer not-a-key"}, 401, "invalid_api_key"),
    ("POST", CHAT, {**CHAT_BODY, "model": "other"}, BEARER_A, 404, "model_not_found"),
    ("POST", CHAT, {**CHAT_BODY, "max_tokens": -1}, BEARER_A, 400, "invalid_value"),
    ("POST", CHAT, CHAT_BODY, {**BEARER_A, "Content-Type": "text/plain"}, 415, "unsupported_media_type"),
    ("POST", CHAT, CHAT_BODY, {**BEARER_A, "Host": "rebound.example"}, 421, "invalid_host"),
    ("GET", "/v1/models", None, {}, 401, "invalid_api_key"),
    ("GET", "/metrics", None, {}, 401, "invalid_api_key"),
])
def test_errors_are_the_single_servers(replicas, method, path, body, headers, status, code):
    r = http_request(replicas.base_url, method, path, body, headers=headers)
    assert r.status == status, r.text
    assert r.json()["error"]["code"] == code
    if status == 401:
        assert r.headers["www-authenticate"] == "Bearer"


def test_a_body_past_the_limit_is_refused(replicas):
    from llaisys_models.serve.request_body import MAX_BODY_BYTES

    r = http_request(replicas.base_url, "POST", CHAT, raw=b" " * (MAX_BODY_BYTES + 1), headers=BEARER_A)
    assert r.status == 413 and r.json()["error"]["code"] == "request_too_large"


def test_health_models_and_cors(replicas):
    assert http_request(replicas.base_url, "GET", "/health").json() == {"status": "ok", "model": CHAT_MODEL}
    assert [m["id"] for m in http_request(replicas.base_url, "GET", "/v1/models", headers=BEARER_A).json()["data"]] \
        == [CHAT_MODEL]
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    r = http_request(replicas.base_url, "OPTIONS", CHAT, headers=preflight)
    assert r.status == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    r = http_request(replicas.base_url, "OPTIONS", CHAT, headers={**preflight, "Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers


# -- metrics -------------------------------------------------------------------------------------------------------

def ray_metric(name: str, labels: str = "") -> dict[str, float]:
    """Each replica's sample of ``name`` (whose labels include ``labels``), from every node's metrics export."""
    import ray

    out = {}
    for node in ray.nodes():
        if node["Alive"]:
            url = f"http://{LOOPBACK}:{node['MetricsExportPort']}/metrics"
            with contextlib.suppress(OSError):  # (an agent not serving yet)
                for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
                    if line.startswith(f"ray_{name}{{") and labels in line:
                        out[re.search(r'replica="([^"]+)"', line)[1]] = float(line.rsplit(" ", 1)[1])
    return out


def test_every_replicas_metrics_reach_rays_prometheus_export(replicas, first_turns):
    served = {replica for _, _, replica, _ in first_turns}
    assert wait_until(lambda: all(ray_metric("llaisys_generation_tokens_total").get(r, 0) > 0 for r in served),
                      timeout=TIMEOUT), ray_metric("llaisys_generation_tokens_total")
    r = http_request(replicas.base_url, "GET", "/metrics", headers=BEARER_A)  # the application's own: every replica's
    assert r.status == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert served <= set(re.findall(r'^ray_llaisys_generation_tokens_total\{[^}]*replica="([^"]+)"', r.text, re.M))
    assert r.text.count("# TYPE ray_llaisys_generation_tokens_total counter") == 1


def test_a_client_that_hangs_up_cancels_its_request_on_the_replica(replicas):
    def cancelled() -> float:
        return sum(ray_metric("llaisys_requests_finished_total", 'reason="cancelled"').values())

    before = cancelled()
    stream = replicas.client().chat.completions.create(
        stream=True, model=CHAT_MODEL, messages=user("A very long story"), max_tokens=3000, temperature=0)
    next(iter(stream))
    stream.close()  # hang up mid-stream: the replica's engine drops the request (else it runs 3000 tokens)
    assert wait_until(lambda: cancelled() > before, timeout=TIMEOUT)


# -- a replica killed ------------------------------------------------------------------------------------------

def test_a_killed_replica_loses_no_waiting_request_and_is_replaced(replicas, cluster, first_turns, chat_server):
    from ray import serve

    from llaisys_models.serve.replicas.deployments import APP_NAME, REPLICA

    victims = processes_titled(cluster, REPLICA_PROCESS)
    assert len(victims) == 2, victims
    requests = [{"model": CHAT_MODEL, "messages": user(f"Long story {i}"), "max_tokens": 120, "temperature": 0}
                for i in range(8)]
    expected = at_once([lambda r=r: ask(chat_server.client(), r, stream=False)[0] for r in requests])
    started = threading.Event()

    def canary():  # a stream that has started when the replica dies may end with an error, but never hangs
        try:
            stream = replicas.client().chat.completions.create(stream=True, **requests[0])
            for _ in stream:
                started.set()
            return "finished"
        except openai.APIError:
            return "ended with an error"

    def kill():
        assert started.wait(TIMEOUT)  # the canary streams: the long requests, sent with it, are being served
        os.kill(victims[0], signal.SIGKILL)
        return "killed"

    def long_request(i):
        return lambda: ask(replicas.client(KEYS[i % 2]), requests[i], stream=False)[0]

    results = at_once([long_request(i) for i in range(8)] + [canary, kill])
    assert results[:8] == expected  # every request that had sent nothing yet was answered, by the survivor
    assert results[8] in ("finished", "ended with an error")

    old = {replica for _, _, replica, _ in first_turns}
    probes = iter(range(1 << 20))

    def a_new_replica_answers() -> bool:  # (each probe a new chat: routed by load, not to the holder of its prefix)
        probe = {**CHAT_BODY, "messages": user(f"Probe {next(probes)}")}
        return ask(replicas.client(), probe, stream=False)[1] not in old

    assert wait_until(a_new_replica_answers, timeout=3 * TIMEOUT)
    status = serve.status().applications[APP_NAME].deployments[REPLICA]
    assert status.status == "HEALTHY" and status.replica_states == {"RUNNING": 2}, status


def test_a_replica_whose_engine_stopped_fails_its_health_check():
    """Ray Serve calls check_health every period and replaces a replica it fails for (as one whose process died):
    a stopped engine, or a tensor-parallel replica whose group failed."""
    from types import SimpleNamespace

    from llaisys_models.serve.replicas.deployments import LlaisysReplica

    def replica(alive: bool, error: str | None, followers=None):
        model = SimpleNamespace(followers=followers)  # (followers: a tensor-parallel model's other ranks)
        return SimpleNamespace(server=SimpleNamespace(engine=SimpleNamespace(alive=alive, error=error, model=model)))

    LlaisysReplica.check_health(replica(True, None))
    LlaisysReplica.check_health(replica(True, None, SimpleNamespace(failure=None)))
    with pytest.raises(RuntimeError, match="rank 1 .* died"):  # a rank died while the engine was idle
        LlaisysReplica.check_health(replica(True, None, SimpleNamespace(failure="tensor-parallel group of 2 ranks "
                                                                                  "closed: rank 1 (a Ray actor) died")))
    with pytest.raises(RuntimeError, match="the engine stopped: MemoryError"):
        LlaisysReplica.check_health(replica(False, "the engine stopped: MemoryError"))
    with pytest.raises(RuntimeError, match="the engine is not running"):
        LlaisysReplica.check_health(replica(False, None))
