"""``llaisys generate`` and ``llaisys infer``: subcommands of the core ``llaisys`` command.

Registered through the entry-point group ``llaisys.commands``; each ``register_*`` adds a
parser whose ``func(args) -> int`` runs the command. Errors are one line (core prints a
LlaisysError as ``llaisys: error: ...``, exit 2); Ctrl-C ends a command quietly with exit
status 130, except during a chat's reply, where it stops the reply and the chat goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from ..engine import kv_cache
from ..families import numerics
from ..loading import quantize
from ..text.chat import DEFAULT_NEW_TOKENS  # generate's reply budget, shrunk to what the model's context leaves
from . import speculative_flags

if TYPE_CHECKING:
    from ..families.causal_lm import CausalLM
    from ..text.reasoning import ReasoningParser, ReasoningSplitter
    from ..text.tokenizer import Tokenizer

Command = Callable[[argparse.Namespace], int]  # a subcommand's ``func(args) -> int``

DEFAULT_PROMPT = "12+34="  # what the demo model (no --model) answers
MODEL_PROMPT = "What is the capital of France?"  # a question any chat model answers, for --model
PROMPT_HELP = f"the prompt (default: {DEFAULT_PROMPT!r} for the demo model, {MODEL_PROMPT!r} with --model)"
TORCH_CPU_HINT = ("pip install torch --index-url https://download.pytorch.org/whl/cpu (torch's CPU-only wheels; "
                  "a plain `pip install torch` brings the CUDA build, several GB)")
MODEL_HELP = ("HuggingFace model directory, GGUF file or Hugging Face Hub id (org/name[@revision][:gguf-tag-or-file], "
              "from the local Hub cache, else downloaded) (default: the demo model shipped with llaisys-models)")


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}")
    return value


def _common_arguments(parser: argparse.ArgumentParser, new_tokens_help: str) -> None:
    parser.add_argument("--model", type=Path, default=None, metavar="PATH|ID",
                        help=MODEL_HELP)
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: the best available)")
    parser.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16", "f32", "f16", "bf16"],
                        help="compute dtype (default: the dtype the weights are stored in)")
    numerics.add_argument(parser)
    quantize.add_argument(parser)
    kv_cache.add_argument(parser)
    add_tensor_parallel_argument(parser)
    parser.add_argument("--max-new-tokens", type=_count, default=None, metavar="N", help=new_tokens_help)
    parser.add_argument("--raw", action="store_true",
                        help="feed the prompt text as is, without the tokenizer's chat template")


def add_tensor_parallel_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tensor-parallel", type=_count, default=1, metavar="N",
                        help="split the model over N ranks, one process per device (--device cuda: cuda:0 .. "
                             "cuda:N-1; the CPU: N processes sharing its cores) (default 1)")
    parser.add_argument("--distributed-executor", choices=["local", "ray"], default=None,
                        help="who starts the ranks of --tensor-parallel: 'local', processes of this host (default), "
                             "or 'ray', actors of a Ray cluster (the 'ray' extra; the one RAY_ADDRESS names, else "
                             "one started here) in a placement group of one bundle per rank: GPU ranks on any node, "
                             "CPU ranks on this host (their collectives are shared memory)")


def add_generation_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--generation-config", choices=["model", "none"], default="model",
                        help="'model': the sampling settings the model ships (its generation_config.json, or a GGUF "
                             "file's general.sampling keys) stand for the flags not given, as in HF transformers and "
                             "vLLM; 'none': llaisys' defaults alone (greedy) (default: model)")


class TensorParallel(TypedDict):
    """``load``'s tensor-parallel arguments."""
    tensor_parallel: int
    distributed_executor: str | None


def tensor_parallel_options(args: argparse.Namespace) -> TensorParallel:
    """``load``'s tensor-parallel arguments from the flags (a LlaisysValueError names a wrong one)."""
    from llaisys import LlaisysValueError

    if args.distributed_executor == "ray" and args.tensor_parallel <= 1:
        raise LlaisysValueError("--distributed-executor ray places the ranks of --tensor-parallel N: give N > 1")
    return {"tensor_parallel": args.tensor_parallel, "distributed_executor": args.distributed_executor}


def split_cpu_threads(ranks: int) -> None:
    """Before the CPU backend starts: N ranks share the cores (OMP_NUM_THREADS each, unless it is set). The
    ranks this process starts inherit it; this process (rank 0) reads it when the backend loads."""
    if ranks > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // ranks))


def _command(func: Command) -> Command:
    """A subcommand that Ctrl-C ends quietly, with the status a shell gives SIGINT (128 + 2)."""
    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except KeyboardInterrupt:
            sys.stderr.write("\n")
            return 130
    return run


def register_generate(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("generate", help="generate text with a model, streaming tokens as they come",
                              description="Generate text, printing it as it is produced, then the prefill "
                                          "and decode speed.")
    _common_arguments(p, f"most new tokens per answer (default: {DEFAULT_NEW_TOKENS}, or fewer when the "
                         f"prompt leaves less room in the model's context; 0 generates nothing)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--prompt", default=None, help=PROMPT_HELP)
    source.add_argument("--chat", action="store_true",
                        help="an interactive chat on stdin (/exit or end of input ends it); the oldest exchanges "
                             "are dropped when the conversation outgrows the model's context")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: 1.0)")
    p.add_argument("--top-k", type=int, default=None,
                   help="sample among the k most likely tokens; 1 is greedy (default: 1, or 0 = all tokens when "
                        "--temperature or --top-p asks for sampling)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling threshold (default: 1.0)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed, 0 to 2**64-1 (default: random)")
    p.add_argument("--repetition-penalty", type=float, default=None, metavar="R",
                   help="HF transformers' repetition penalty on every token of the prompt and the reply: a "
                        "logit divided by R where positive, multiplied where negative; > 0 (default: 1.0 = off; "
                        "1.1 to 1.3 is usual)")
    p.add_argument("--frequency-penalty", type=float, default=None, metavar="F",
                   help="OpenAI's: each logit lowered by F times its token's count in the reply, -2 to 2 "
                        "(default: 0 = off)")
    p.add_argument("--presence-penalty", type=float, default=None, metavar="P",
                   help="OpenAI's: each logit lowered by P once its token is in the reply, -2 to 2 (default: 0 = off)")
    add_generation_config_argument(p)
    p.add_argument("--lora", type=Path, default=None, metavar="PATH",
                   help="generate under the LoRA adapter at PATH (a PEFT directory or a llama.cpp GGUF adapter), "
                        "applied beside the model's weights (default: the model alone)")
    speculative_flags.add_arguments(p, "(greedy and seeded replies are the same as without it)")
    add_reasoning_arguments(p)
    p.set_defaults(func=_command(run_generate))


def add_reasoning_arguments(parser: argparse.ArgumentParser) -> None:
    """--chat's flags for a reasoning model's thinking (text/reasoning.py)."""
    from ..text.reasoning import CHOICES

    group = parser.add_argument_group("reasoning models (--chat)",
                                      "A reasoning model's thinking (DeepSeek-R1 and its distills, Qwen3, QwQ) is "
                                      "printed apart from its answer: dimmed on a terminal, else under a "
                                      "'Thinking:' line, with the answer under an 'Answer:' line.")
    group.add_argument("--reasoning-parser", default=None, metavar="NAME",
                       help=f"how the thinking is told apart: {', '.join(CHOICES)} ('auto': as the chat template "
                            f"says; 'none': the reply printed as it comes) (default: auto)")
    group.add_argument("--hide-reasoning", action="store_true", help="print the answer alone, not the thinking")
    group.add_argument("--thinking-budget", "--thinking-token-budget", dest="thinking_budget", default=None,
                       metavar="N", help="thinking tokens at most per reply (counted in --max-new-tokens); then the "
                                         "thinking is closed for the model and it answers (default: unbounded)")
    group.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                       help="more variables for the chat template, as a JSON object, e.g. "
                            "'{\"enable_thinking\": false}' (Qwen3: no thinking)")


REASONING_FLAGS = ("--reasoning-parser", "--hide-reasoning", "--thinking-budget", "--chat-template-kwargs")


def _reasoning_flags(args: argparse.Namespace) -> dict[str, Any]:
    """--chat's reasoning flags, checked before the model loads (a LlaisysValueError, one line, names a wrong
    one): {parser name, budget or None, template variables}."""
    from llaisys import LlaisysValueError

    from ..text.reasoning import CHOICES
    from ..text.template_kwargs import parse_kwargs

    given = [flag for flag in REASONING_FLAGS if getattr(args, flag[2:].replace("-", "_")) not in (None, False)]
    if given and not args.chat:
        raise LlaisysValueError(f"{given[0]} applies to --chat replies (without --chat, generate prints the "
                                f"model's text as it comes)")
    name = "auto" if args.reasoning_parser is None else args.reasoning_parser
    if name not in CHOICES:
        raise LlaisysValueError(f"--reasoning-parser {name!r} is not a reasoning parser: use one of "
                                f"{', '.join(CHOICES)}")
    budget = None
    if args.thinking_budget is not None:
        try:
            budget = int(args.thinking_budget)
        except ValueError:
            budget = -1
        if budget < 0:
            raise LlaisysValueError(f"--thinking-budget must be a whole number >= 0, got {args.thinking_budget!r}")
    return {"parser": name, "budget": budget,
            "template_kwargs": parse_kwargs(args.chat_template_kwargs, "--chat-template-kwargs")}


def register_infer(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("infer", help="greedy inference; --test checks it against HF transformers",
                              description="Greedy generation on a chat-templated prompt. With --test, HF transformers "
                                          "generates too and llaisys runs teacher-forced on HF's tokens; each step "
                                          "where the two choose differently is judged against the exact logits (the "
                                          "same weights in float64): a near-tie when both choices are within the "
                                          "rounding error HF itself shows of the exact maximum, else a mismatch. "
                                          "Exit status 0 when every divergence is a near-tie, 1 on any mismatch.")
    _common_arguments(p, "most new tokens (default: %(default)s)")
    p.add_argument("--prompt", default=None, help=PROMPT_HELP)
    p.add_argument("--test", action="store_true",
                   help="also run HF transformers (needs torch) and classify every divergence; the exact "
                        "reference holds the weights in float64 (8 bytes per parameter)")
    p.add_argument("--strict", action="store_true", help="--test, and require identical tokens (near-ties fail too)")
    p.set_defaults(func=_command(run_infer), max_new_tokens=64)


def default_prompt(args: argparse.Namespace) -> str:
    """--prompt, else the demo's sum without --model, a question with it."""
    if args.prompt is not None:
        return args.prompt
    return DEFAULT_PROMPT if args.model is None else MODEL_PROMPT


def model_dir(args: argparse.Namespace) -> Path:
    from .. import DEMO_MODEL_DIR
    from ..errors import ModelLoadError

    if args.model is not None:
        from ..loading.hub import resolve

        return resolve(args.model)  # a Hub id: its copy in the Hub cache
    if not (DEMO_MODEL_DIR / "config.json").is_file():
        raise ModelLoadError(f"no --model given and the demo model is missing from this installation "
                             f"({DEMO_MODEL_DIR} has no config.json); pass --model DIR")
    return DEMO_MODEL_DIR


def _load(args: argparse.Namespace) -> tuple[CausalLM, Tokenizer, float]:
    from .. import load
    from ..text.tokenizer import load_tokenizer

    _quiet_transformers()
    path = model_dir(args)
    t0 = time.perf_counter()
    parallel = tensor_parallel_options(args)
    split_cpu_threads(args.tensor_parallel)
    model = load(path, device=args.device, dtype=args.dtype, numerics=args.numerics, quantize=args.quantize,
                 dequantize=args.dequantize, kv_cache_dtype=args.kv_cache_dtype, **parallel)
    elapsed = time.perf_counter() - t0
    tokenizer = load_tokenizer(path)
    weights = f" with {'/'.join(model.weight_formats)} weights" if model.weight_formats else ""
    if args.tensor_parallel > 1:
        weights += f", split over {args.tensor_parallel} ranks" + (" on Ray" if args.distributed_executor == "ray"
                                                                     else "")
    print(f"loaded {path} on {model.device} as {model.dtype.name}{weights} (numerics {model.numerics}) in "
          f"{elapsed:.2f}s", file=sys.stderr)
    return model, tokenizer, elapsed


LORA_NAME = "adapter"  # the name --lora's adapter is loaded under


def _load_lora(model: CausalLM, path: Path) -> str:
    """The adapter at ``path`` (--lora) loaded into ``model`` (its slots sized to its rank): its name. A one-line
    error names --lora where it cannot be read or does not fit the model."""
    from llaisys import LlaisysError, LlaisysValueError

    try:
        adapter = model.load_lora(LORA_NAME, path)
    except (LlaisysError, OSError) as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise LlaisysValueError(f"--lora {path}: {message}") from None
    print(f"LoRA adapter {path}: rank {adapter.rank}, {len(adapter.pairs)} linears ({', '.join(adapter.targets)})",
          file=sys.stderr)
    return LORA_NAME


def _quiet_transformers() -> None:
    """Keep transformers' notices (advisories, "sequence longer than model_max_length", ...) off the
    console: the command says what matters itself, in one line."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # read when transformers is first imported
    if "transformers" in sys.modules:  # already imported (main() called from Python): tell it directly
        sys.modules["transformers"].logging.set_verbosity_error()


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    from llaisys import LlaisysValueError

    from ..engine.penalties import PENALTY_FLAGS
    from ..engine.sampling import check_sampling
    from ..text.chat import sampling_args

    chosen = sampling_args(args.top_k, args.top_p, args.temperature, args.seed)
    penalties = {name: getattr(args, name) for name in PENALTY_FLAGS if getattr(args, name) is not None}
    try:  # before the model loads: a bad flag fails at once, not after the prefill
        check_sampling(**chosen)
        for name, value in penalties.items():
            PENALTY_FLAGS[name](value)
    except LlaisysValueError as e:  # "top_k must be ..." -> "--top-k must be ..."
        name, _, rest = str(e).partition(" ")
        raise LlaisysValueError(f"--{name.replace('_', '-')} {rest}") from None
    return {**chosen, **penalties}


def _model_sampling(args: argparse.Namespace, model: CausalLM) -> dict[str, Any]:
    """The sampling arguments: the flags given, and for each one not given the model's own setting (unless
    --generation-config none), said in one line when the model has any."""
    if args.generation_config == "none":
        return _sampling(args)
    defaults = model.generation_defaults
    if defaults.describe():
        print(f"sampling as the model says: {defaults.describe()} (flags given take precedence; "
              f"--generation-config none: greedy)", file=sys.stderr)
    given = defaults.fill(top_k=args.top_k, top_p=args.top_p, temperature=args.temperature,
                          repetition_penalty=args.repetition_penalty)
    return _sampling(argparse.Namespace(**{**vars(args), **given}))


def _stream(model: CausalLM, tokenizer: Tokenizer, ids: list[int], max_new_tokens: int, sampling: dict[str, Any],
            stop: threading.Event | None = None) -> list[int]:
    """Print the reply as it is generated; ``stop`` set ends it after the token being computed."""
    from ..text.tokenizer import IncrementalDecoder

    decoder = IncrementalDecoder(tokenizer)
    tokens = model.stream_generate(ids, max_new_tokens, **sampling)
    try:
        for token in tokens:
            sys.stdout.write(decoder.push(token))
            sys.stdout.flush()
            if stop is not None and stop.is_set():
                break
    finally:
        tokens.close()  # frees the sequence's KV blocks of a reply stopped early
    sys.stdout.write(decoder.finish() + "\n")
    _print_stats(model)
    return decoder.tokens


def _print_stats(model: CausalLM) -> None:
    """The reply's speed, one line on stderr."""
    s = model.last_stats
    assert s is not None  # (set when the stream started)
    print(f"{s.new_tokens} new tokens | first token after {s.first_token_seconds * 1000:.0f} ms "
          f"| prefill: {s.prompt_tokens} tokens at {s.prefill_tokens_per_second:.1f} tok/s "
          f"| decode: {max(s.new_tokens - 1, 0)} steps at {s.decode_tokens_per_second:.1f} tok/s"
          + (f" | drafted {s.draft_tokens}, kept {s.accepted_tokens}" if s.draft_tokens else ""), file=sys.stderr)


def run_generate(args: argparse.Namespace) -> int:
    from llaisys import LlaisysValueError

    from ..text.chat import reply_budget
    from ..text.tokenizer import check_text, encode

    if args.chat and args.max_new_tokens == 0:
        raise LlaisysValueError("--chat needs --max-new-tokens of at least 1 to answer anything")
    prompt = default_prompt(args)
    if not args.chat:
        check_text(prompt, "--prompt")
    _sampling(args)  # (the flags checked before the model loads)
    reasoning = _reasoning_flags(args)
    speculative_flags.check_arguments(args)
    model, tokenizer, _ = _load(args)
    sampling = _model_sampling(args, model)
    speculation, _ = speculative_flags.from_arguments(args, model)
    if speculation is not None:
        sampling["speculative"] = speculation
    if args.lora is not None:
        sampling["lora"] = _load_lora(model, args.lora)
    if args.chat:
        return _chat(model, tokenizer, args, sampling, reasoning)
    ids = encode(tokenizer, prompt, chat=not args.raw)
    max_new_tokens = reply_budget(args.max_new_tokens, len(ids), model.context_length, "--max-new-tokens")
    if max_new_tokens == 0:
        print(f"--max-new-tokens 0: nothing to generate (the prompt is {len(ids)} tokens)", file=sys.stderr)
        return 0
    _stream(model, tokenizer, ids, max_new_tokens, sampling)
    return 0


def _chat(model: CausalLM, tokenizer: Tokenizer, args: argparse.Namespace, sampling: dict[str, Any],
          reasoning: dict[str, Any]) -> int:
    from llaisys import LlaisysValueError

    from ..text.chat_prompt import ChatHistory

    if not getattr(tokenizer, "chat_template", None):
        raise LlaisysValueError(f"--chat needs a chat template, and the tokenizer of {model.path.name} has none; "
                                f"use --prompt TEXT --raw to continue a plain text")
    parser, template_kwargs = _reasoning_parser(model, tokenizer, reasoning)
    display = None
    if parser is not None:
        display = ReasoningDisplay("hidden" if args.hide_reasoning else "dim" if _colors(sys.stdout) else "marked")
    if hasattr(sys.stdin, "reconfigure"):  # undecodable bytes reach check_text (one message), not input()
        sys.stdin.reconfigure(errors="surrogateescape")
    budget = DEFAULT_NEW_TOKENS if args.max_new_tokens is None else args.max_new_tokens
    history = ChatHistory(tokenizer, model.context_length, budget, template_kwargs)
    print("chat: type a message, /exit or end of input to stop", file=sys.stderr)
    prompt = "> " if sys.stdin.isatty() else ""  # piped input: the output is the replies alone
    while True:
        try:
            line = input(prompt)
        except EOFError:
            print(file=sys.stderr)
            return 0
        if line.strip() in ("/exit", "/quit"):
            return 0
        if not line.strip():
            continue
        try:
            turn = history.turn(line)
        except LlaisysValueError as e:  # this message cannot be answered; the chat goes on
            print(f"llaisys: {e}", file=sys.stderr)
            continue
        if turn.dropped:
            print(f"(the {turn.dropped} oldest exchange{'s' * (turn.dropped > 1)} no longer fit in the model's "
                  f"context of {model.context_length} positions and were dropped)", file=sys.stderr)
        # the conversation so far is in the model's prefix cache: only the new message and reply are computed
        with _ctrl_c_sets() as stopped:
            if parser is None:
                tokens = _stream(model, tokenizer, turn.ids, turn.max_new_tokens, sampling, stopped)
                answer = tokenizer.decode(tokens, skip_special_tokens=True)
            else:
                assert display is not None
                thinking = parser.rule(turn.ids, reasoning["budget"])
                answer = _stream_reasoning(model, tokenizer, turn.ids, turn.max_new_tokens,
                                           {**sampling, "thinking": thinking}, parser.splitter(turn.ids),
                                           parser.keep, display, stopped)
        if stopped.is_set():
            print("(stopped; Ctrl-C at the prompt ends the chat)", file=sys.stderr)
        history.add(turn, line, answer)  # (the answer alone: a template shows no earlier thinking)


def _reasoning_parser(model: CausalLM, tokenizer: Tokenizer,
                      reasoning: dict[str, Any]) -> tuple[ReasoningParser | None, dict[str, Any]]:
    """The chat's reasoning parser (None: the replies printed as they come) and its template variables (those the
    template reads; the others named in one line and dropped)."""
    from llaisys import LlaisysValueError

    from ..text.reasoning import load_parser
    from ..text.template_kwargs import template_names, usable

    variables, unread = usable(reasoning["template_kwargs"], template_names(tokenizer))
    if unread:
        print(f"--chat-template-kwargs: the chat template of {model.path.name} reads no "
              f"{', '.join(map(repr, unread))}; ignored", file=sys.stderr)
    parser = load_parser(tokenizer, reasoning["parser"])
    if parser is None and reasoning["budget"] is not None:
        raise LlaisysValueError(f"--thinking-budget needs a reasoning model: the chat template of {model.path.name} "
                                f"has no thinking" + (" (--reasoning-parser none)" if reasoning["parser"] == "none"
                                                      else ""))
    return parser, variables


def _colors(stream: Any) -> bool:
    """Whether ``stream`` is a terminal that takes ANSI styles (NO_COLOR, https://no-color.org, says no)."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty()) and not os.environ.get("NO_COLOR") and \
        os.environ.get("TERM") != "dumb"


DIM, NORMAL = "\x1b[2m", "\x1b[0m"  # ANSI faint, and back to normal
THINKING_HEADER, ANSWER_HEADER = "Thinking:\n", "Answer:\n"


class ReasoningDisplay:
    """How a chat prints a reasoning model's reply, its thinking first, then its answer; ``mode``:

    dim      the thinking in faint text (ANSI ``ESC[2m``), a blank line, then the answer (stdout a terminal)
    marked   a ``Thinking:`` line, the thinking, then an ``Answer:`` line and the answer (stdout a file or
             pipe, or NO_COLOR set); a reply that did not think is its answer alone, without either line
    hidden   the answer alone (--hide-reasoning)
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self._part = ""  # what was written last: "", "thought" or "answer"

    def write(self, thought: str, answer: str) -> str:
        """The text that shows these parts of the reply (either may be "")."""
        out = ""
        if thought and self.mode != "hidden":
            if not self._part:
                out += DIM if self.mode == "dim" else THINKING_HEADER
            out += thought
            self._part = "thought"
        if answer:
            out += self._to_answer() + answer
            self._part = "answer"
        return out

    def end(self) -> str:
        """What ends the reply's text (before its final newline); ready for the next reply. A reply that ended in
        its thinking (out of tokens, or stopped) ends its faint text, or shows its empty answer."""
        out = ""
        if self._part == "thought":
            out = NORMAL if self.mode == "dim" else self._to_answer()
        self._part = ""
        return out

    def _to_answer(self) -> str:
        if self._part != "thought":
            return ""
        return NORMAL + "\n\n" if self.mode == "dim" else "\n" + ANSWER_HEADER


def _stream_reasoning(model: CausalLM, tokenizer: Tokenizer, ids: list[int], max_new_tokens: int,
                      sampling: dict[str, Any], splitter: ReasoningSplitter, keep: frozenset[int],
                      display: ReasoningDisplay, stop: threading.Event | None = None) -> str:
    """``_stream`` for a reasoning model: the reply printed as ``display`` shows its thinking and answer; returns
    the answer."""
    from ..text.tokenizer import IncrementalDecoder

    decoder = IncrementalDecoder(tokenizer, keep)  # (the tags' text kept for the splitter, special or not)
    answer: list[str] = []

    def show(parts: tuple[str, str]) -> None:
        answer.append(parts[1])
        sys.stdout.write(display.write(*parts))
        sys.stdout.flush()

    tokens = model.stream_generate(ids, max_new_tokens, **sampling)
    try:
        try:
            for token in tokens:
                if token in model.eos_token_ids:  # (no text of its own)
                    continue
                show(splitter.push(decoder.push(token)))
                if stop is not None and stop.is_set():
                    break
        finally:
            tokens.close()  # frees the sequence's KV blocks of a reply stopped early
        show(splitter.push(decoder.finish()))
        show(splitter.finish())
    finally:
        sys.stdout.write(display.end() + "\n")  # (a terminal's style reset, whatever ended the reply)
    _print_stats(model)
    return "".join(answer)


@contextlib.contextmanager
def _ctrl_c_sets() -> Iterator[threading.Event]:
    """An event that SIGINT sets instead of raising KeyboardInterrupt, for the block's duration (as llama.cpp
    and ollama, Ctrl-C stops a reply, not the chat). SIGINT left ignored (``nohup``) stays ignored."""
    stopped = threading.Event()
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN or threading.current_thread() is not threading.main_thread():
        yield stopped
        return
    previous = signal.signal(signal.SIGINT, lambda *_: stopped.set())
    try:
        yield stopped
    finally:
        signal.signal(signal.SIGINT, previous)


def run_infer(args: argparse.Namespace) -> int:
    from llaisys import LlaisysValueError

    from ..text.tokenizer import encode

    if (args.test or args.strict) and args.kv_cache_dtype != "auto":
        raise LlaisysValueError(f"--test checks llaisys against HF transformers token for token, which "
                                f"--kv-cache-dtype {args.kv_cache_dtype} departs from by design; run --test without it")
    if (args.test or args.strict) and args.quantize:
        raise LlaisysValueError(f"--test checks llaisys against HF transformers token for token, which --quantize "
                                f"{args.quantize} departs from by design; run --test without --quantize")
    if args.test or args.strict:  # what HF transformers needs, said before the model loads
        if not _installed("torch"):
            print(f"llaisys: error: --test runs HF transformers, which needs torch: {TORCH_CPU_HINT}", file=sys.stderr)
            return 2
        if model_dir(args).is_file() and not _installed("accelerate"):
            print("llaisys: error: --test has HF transformers read the GGUF file, which it does only with "
                  "accelerate installed: pip install accelerate", file=sys.stderr)
            return 2
    if (args.test or args.strict) and model_dir(args).is_file():  # HF decodes a GGUF file's blocks into floats:
        args.dequantize = True  # compare like with like (a GPTQ / AWQ directory's groups run as they are: HF gets
        # their exact dequantization, which linear_gq computes: cli/parity.py)
    model, tokenizer, _ = _load(args)
    ids = encode(tokenizer, default_prompt(args), chat=not args.raw)
    t0 = time.perf_counter()
    ours = model.generate(ids, args.max_new_tokens)
    ours_s = time.perf_counter() - t0
    print(f"llaisys ({model.device}, {ours_s:.2f}s, {len(ours) - len(ids)} new tokens):")
    print(tokenizer.decode(ours[len(ids):], skip_special_tokens=True))
    if not (args.test or args.strict):
        return 0

    from .parity import compare, hf_reference

    reference = hf_reference(model.path, ids, args.max_new_tokens, model.dtype.name, model.eos_token_ids)
    print(f"\nHF transformers (torch cpu, {reference.seconds:.2f}s, {len(reference.tokens)} new tokens):")
    print(tokenizer.decode(reference.tokens, skip_special_tokens=True))
    report = compare(model, ids, args.max_new_tokens, reference=reference)
    print()
    for line in report.describe(lambda token: tokenizer.decode([token])):
        print(line)
    print(f"teacher-forced on HF's tokens: {report.summary()}")
    if not report.divergences:
        print(f"PASS: identical {report.steps} new tokens; llaisys {ours_s:.2f}s vs HF {reference.seconds:.2f}s")
        return 0
    if report.mismatches:
        print(f"FAIL: {report.mismatches} mismatch{'es' * (report.mismatches > 1)}, first at step "
              f"{next(d.step for d in report.divergences if d.verdict == 'mismatch')}: llaisys chose a token further "
              f"below the exact maximum than {model.dtype.name} rounding explains")
        return 1
    if args.strict:
        print(f"FAIL (--strict): the tokens differ at {report.near_ties} step(s), first at step "
              f"{report.first_divergence}; each is a near-tie that {model.dtype.name} rounding explains")
        return 1
    print(f"PASS: the tokens differ only at near-ties that {model.dtype.name} rounding explains (first at step "
          f"{report.first_divergence}); --strict requires identical tokens")
    return 0


def _installed(package: str) -> bool:
    """Whether ``package`` can be imported (torch, which HF transformers runs on and llaisys does not need; accelerate,
    without which transformers refuses a GGUF file)."""
    import importlib.util

    return importlib.util.find_spec(package) is not None
