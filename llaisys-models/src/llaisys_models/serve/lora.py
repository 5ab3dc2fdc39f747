"""LoRA adapters served beside the base model, as vLLM serves them.

    llaisys serve --model base --lora sql=path/to/sql-adapter --lora chat=path/to/chat.gguf [--allow-runtime-lora]

A request's ``model`` names what answers it: the served model's name (or no ``model``) is the base model, an
adapter's name that adapter; any other name is a 404 (``model_not_found``). ``/v1/models`` lists each adapter after
the base model, with ``parent`` (the base model's id) and ``root`` (the path it was loaded from). The base model and
every adapter run in the same batches (at most ``--max-loras`` adapters in one forward; a request under one more
waits for a running adapter's requests to end), and the prefix cache is keyed by adapter.

With ``--allow-runtime-lora``, ``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path"}`` and ``POST
/v1/unload_lora_adapter`` ``{"lora_name"}`` change the set while the server runs (without it they answer 404,
as routes the server does not have). A load reads the adapter's files on a worker thread (the engine goes on
meanwhile; the model takes its step lock only to wrap the adapted linears). An unload takes the name away at once
(new requests naming it get the 404), waits for the requests that run or queue under it to end, then frees it,
and answers; a wait longer than ``UNLOAD_WAIT_S`` answers 202 and the adapter is freed when they end.

Names (``ServedAdapters``' states, all changed on the event loop): loading (its files being read: neither usable
nor loadable again), loaded (in ``model.loras``), retiring (being unloaded: in ``model.loras``, not usable). A
request that found the adapter loaded but reaches the engine after the unload began is refused by the engine
(``engine.AdapterRetired``: the same 404).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from llaisys import LlaisysError, LlaisysValueError

from .errors import APIError, invalid
from .request_body import field, read_json

if TYPE_CHECKING:
    from ..families.causal_lm import CausalLM
    from ..lora.adapter import LoRAAdapter
    from .engine import Engine
    from .server import Server

log = logging.getLogger("llaisys.serve")

UNLOAD_WAIT_S = 60.0  # how long an unload's answer waits for the requests under the adapter (then 202)
MAX_NAME = 256  # characters of an adapter's name (model.load_lora's limit)


def not_found(model: str, served: str, adapters: Iterable[str] = ()) -> APIError:
    """The 404 of a request whose ``model`` names neither the served model nor one of its adapters."""
    names = list(adapters)
    also = f" and its LoRA adapters {', '.join(repr(n) for n in names)}" if names else ""
    return APIError(404, f"the model '{model}' does not exist; this server serves '{served}'{also}", "model",
                    "model_not_found")


def parse_modules(specs: Iterable[str], served: str | None = None) -> list[tuple[str, str]]:
    """``--lora NAME=PATH`` options as (name, path) pairs, in order; a LlaisysValueError names the first one wrong
    (no ``=``, an empty or repeated name, the served model's name ``served``)."""
    modules: list[tuple[str, str]] = []
    for spec in specs:
        name, equals, path = spec.partition("=")
        name = name.strip()
        if not equals or not name or not path:
            raise LlaisysValueError(f"--lora {spec!r}: give NAME=PATH (the adapter's name, then its PEFT directory "
                                    f"or GGUF file)")
        check_name(name, f"--lora {spec!r}")
        if any(name == other for other, _ in modules):
            raise LlaisysValueError(f"--lora {spec!r}: an adapter named {name!r} is already given")
        if name == served:
            raise LlaisysValueError(f"--lora {spec!r}: {name!r} is the served model's name; give the adapter another")
        modules.append((name, path))
    return modules


def check_name(name: str, where: str) -> None:
    """A LlaisysValueError unless ``name`` can name an adapter: 1 to MAX_NAME printable characters, no blank space
    at either end."""
    if not 0 < len(name) <= MAX_NAME or not name.isprintable() or name != name.strip():
        raise LlaisysValueError(f"{where}: an adapter's name must be 1 to {MAX_NAME} printable characters with no "
                                f"space at either end")


class ServedAdapters:
    """The adapters of a server's model (``model.enable_lora`` done): which name a request may use, and loading
    and unloading them while it serves (``runtime``: the endpoints are on). ``paths``: where each was read from, as
    given (``/v1/models``' ``root``)."""

    def __init__(self, engine: Engine, base_name: str, runtime: bool = False,
                 paths: dict[str, str] | None = None) -> None:
        self.engine = engine
        self.model: CausalLM = engine.model
        self.base_name = base_name
        self.runtime = runtime
        self.paths: dict[str, str] = dict(paths or {})
        self.unload_wait = UNLOAD_WAIT_S
        self._loading: set[str] = set()
        self._retiring: set[str] = set()
        self._background: set[asyncio.Task] = set()  # unloads that outlived their answer

    @property
    def names(self) -> list[str]:
        """The adapters requests may name now, in the order they were loaded."""
        return [name for name in list(self.model.loras) if name not in self._retiring]

    def path_of(self, name: str) -> str:
        return self.paths.get(name) or str(self.model.loras[name].path)

    def resolve(self, name: str | None) -> LoRAAdapter | None:
        """The adapter a request's ``model`` names (None: the base model), else the 404."""
        if name is None or name == self.base_name:
            return None
        adapter = self.model.loras.get(name)
        if adapter is None or name in self._retiring:
            raise not_found(name, self.base_name, self.names)
        return adapter

    # -- at run time (the endpoints; each called on the event loop) ------------------------------------------

    async def load(self, name: str, path: str) -> LoRAAdapter:
        """Read the adapter at ``path`` as ``name`` on a worker thread: 409 for a name in use, 400 (its one-line
        reason) for an adapter that cannot be read or does not fit the model."""
        try:
            check_name(name, "'lora_name'")
        except LlaisysValueError as e:
            raise invalid(str(e), "lora_name") from None
        if name == self.base_name:
            raise APIError(409, f"'{name}' is the served model's name; give the adapter another", "lora_name",
                           "lora_name_taken")
        if name in self._loading or name in self.model.loras:
            why = ("is being loaded" if name in self._loading else "is being unloaded" if name in self._retiring
                   else "is already loaded")
            raise APIError(409, f"the LoRA adapter '{name}' {why}; unload it first, or give another name",
                           "lora_name", "lora_name_taken")
        self._loading.add(name)
        try:
            adapter = await asyncio.get_running_loop().run_in_executor(None, self.model.load_lora, name, Path(path))
        except (LlaisysError, OSError, ValueError) as e:  # the adapter's fault (ModelLoadError: its files' shapes)
            message = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise invalid(f"cannot load the LoRA adapter '{name}': {message}", "lora_path", "invalid_lora_adapter") \
                from None
        finally:
            self._loading.discard(name)
        self.paths[name] = path
        log.info("loaded the LoRA adapter %r from %s (rank %d: %s)", name, path, adapter.rank,
                 ", ".join(adapter.targets))
        return adapter

    async def unload(self, name: str) -> bool:
        """Take ``name`` away: new requests naming it get the 404 at once; those under it now end first, then it is
        freed. True once it is freed; False if its requests outlast ``unload_wait`` seconds (it is freed when they
        end). 404 for a name not loaded."""
        adapter = self.model.loras.get(name)
        if adapter is None or name in self._retiring:
            loaded = ", ".join(repr(n) for n in self.names) or "none"
            why = " (it is being unloaded)" if name in self._retiring else ""
            raise APIError(404, f"no LoRA adapter named '{name}' is loaded{why} (loaded: {loaded})", "lora_name",
                           "lora_not_found")
        self._retiring.add(name)
        task = asyncio.create_task(self._retire(name, adapter))
        try:
            await asyncio.wait_for(asyncio.shield(task), self.unload_wait)
        except asyncio.TimeoutError:
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            return False
        return True

    async def _retire(self, name: str, adapter: LoRAAdapter) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self.engine.retire_adapter, adapter)  # its requests end
            await loop.run_in_executor(None, self.model.unload_lora, name)  # (the step lock, briefly)
            self.paths.pop(name, None)
            log.info("unloaded the LoRA adapter %r", name)
        finally:
            self._retiring.discard(name)


def router(server: Server) -> APIRouter:
    """``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter`` (vLLM's): included only where the server
    allows runtime LoRA loading (else they are absent: 404)."""
    adapters = server.adapters
    assert adapters is not None  # (only where the model serves adapters)
    api = APIRouter()

    @api.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> PlainTextResponse:
        body = await read_json(request, server.max_body_bytes)
        name = field(body, "lora_name", "string", required=True)
        path = field(body, "lora_path", "string", required=True)
        await adapters.load(name, path)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @api.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> PlainTextResponse:
        body = await read_json(request, server.max_body_bytes)
        name = field(body, "lora_name", "string", required=True)
        adapter = adapters.model.loras.get(name)
        if await adapters.unload(name):
            return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")
        users = adapters.engine.adapter_users(adapter) if adapter is not None else 0
        still = "1 request still uses it; it is removed when it ends" if users == 1 else \
            f"{users} requests still use it; it is removed when they end"
        return PlainTextResponse(f"LoRA adapter '{name}' is being removed: {still}.", status_code=202)

    return api
