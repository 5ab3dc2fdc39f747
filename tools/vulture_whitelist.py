"""Names that vulture reports as unused (nox -s lint) but that are used where it does not look.

vulture reads only the packages' src/ folders, so public API that users and the tests call, names that C,
ctypes or a framework reads, and entry points look unused to it. It matches by name: each line below marks
every definition of that name as used. Plugin hooks and FastAPI routes are skipped by --ignore-decorators in
noxfile.py instead. Add a name here only with the reason; delete dead code instead of listing it.
"""

import uvicorn

from llaisys import abi, backend, dlpack, profiler, tensor
from llaisys_models.bench import cli as bench_cli
from llaisys_models.cli import generate as cli
from llaisys_models.cli import parity
from llaisys_models.engine import decode_graph, generation, grammar
from llaisys_models.families import causal_lm, config
from llaisys_models.serve import background, ray_app, shutdown, tool_calls
from llaisys_models.serve import cli as serve_cli
from llaisys_models.serve.replicas import deployments, router
from llaisys_models.text import chat as text

# The ABI mirror: every code of backend.h's enums, whether core's Python reads it or not
# (tests/core/test_abi_header.py checks them against the header).
abi.Status.RUNTIME_ERROR
abi.MemcpyKind.H2H
abi.DeviceAttr.WARP_SIZE
abi.DeviceAttr.MAX_THREADS_PER_BLOCK
abi.DeviceAttr.MULTIPROCESSOR_COUNT
abi.DeviceAttr.TOTAL_MEMORY
abi.DeviceAttr.COMPUTE_CAPABILITY
abi.DeviceAttr.MAX_SHARED_MEMORY_PER_BLOCK
abi.ENUMS

dlpack.DLManagedTensor._fields_  # ctypes reads a Structure's _fields_

# The Backend interface: what a backend implements and its users call (tests/core, tests/backends).
backend.Backend.memcpy_async
backend.Backend.capabilities
backend.Backend.build_info
backend.Backend.malloc_host
backend.Backend.free_host
backend.Backend.event_create
backend.Backend.event_destroy
backend.Backend.event_record
backend.Backend.event_synchronize
backend.Backend.stream_wait_event
backend.Backend.event_elapsed_ms

profiler.OpProfile.trace_events  # public: the events profile(trace=...) writes (tests read them)

# Tensor's public surface (DESIGN.md section 2).
tensor.Tensor.layout
tensor.Tensor.permute
tensor.Tensor.debug

# llaisys-models: entry points (pyproject.toml's llaisys.commands), and what a framework or the caller reads.
cli.register_generate
cli.register_infer
serve_cli.register_serve
bench_cli.register_bench
uvicorn.Server.should_exit  # serve/background.py sets it; uvicorn reads it
shutdown.HTTPServer.capture_signals  # uvicorn.Server.serve calls it
exc  # noqa: F821 (def __exit__(self, *exc) in progress.py and serve/background.py)
ray_app.build_app  # Ray's `serve run llaisys_models.serve.ray_app:build_app` calls it
deployments.LlaisysReplica.check_health  # Ray Serve's health check calls it
router.PrefixAwareRouter.initialize_state  # Ray Serve's RequestRouter interface: Ray calls these
router.PrefixAwareRouter.choose_replicas
router.PrefixAwareRouter.on_request_routed

# llaisys-models: used only by the tests, or public attributes of results (llaisys-models' owners to decide).
config.ModelConfig.bos_token_id
decode_graph.DecodeGraphs.replays
parity.ParityReport.llaisys_choices
parity.ParityReport.ok
causal_lm.CausalLM.clear_decode_graphs
generation.GenerationMixin.generate_batch  # public API (README), used by the tests and benchmarks
text.TextMixin.stream_chat  # public API (README): chat(stream=True) by name, used by the tests
text.TextMixin.stream_complete
background.BackgroundServer.base_url
grammar.Grammar.regex  # public API (README): structured outputs beside json_schema / json_object, used by the tests
grammar.Grammar.lark
tool_calls.parse_tool_calls  # a whole text's calls at once: the tool tests' reference for ToolCallStream
