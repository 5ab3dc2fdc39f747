"""The serving tests' server handles, in a module of their own so that test modules import them by a name no
other folder's file has (``from conftest import ...`` resolves to whichever conftest was imported first)."""

from __future__ import annotations

import pytest

import llaisys
from helpers import skip_without_kernels
from helpers.serve_helpers import http_request
from llaisys_models.families.family import KERNELS


def serve_device(config) -> str | None:
    wanted = config.getoption("--backend")
    if wanted is None:
        return None
    devices = [d for d in llaisys.available_devices() if d.type == wanted]
    if not devices:
        pytest.skip(f"no '{wanted}' device available")
    skip_without_kernels(devices[0], KERNELS, "serving a model")
    return str(devices[0])


class ChatServer:
    """A ``BackgroundServer`` (uvicorn on a thread, a free 127.0.0.1 port) and the tests' handles on it."""

    def __init__(self, server):
        from llaisys_models.serve.background import BackgroundServer

        self.server = server
        self.engine = server.engine
        self.model_name = server.model_name
        self._background = BackgroundServer(server)
        self.port = self._background.port
        self.base_url = self._background.base_url

    def __enter__(self):
        self._background.__enter__()
        return self

    def __exit__(self, *exc):
        self._background.__exit__(*exc)

    def client(self, **kwargs):
        import openai

        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=kwargs.pop("api_key", "unused"), max_retries=0,
                             timeout=kwargs.pop("timeout", 60), **kwargs)

    def metrics(self) -> dict[str, float]:
        """The /metrics samples as {name{labels}: value}."""
        return parse_metrics(http_request(self.base_url, "GET", "/metrics", timeout=10).text)


def parse_metrics(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out
