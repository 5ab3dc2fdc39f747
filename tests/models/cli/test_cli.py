"""``llaisys generate`` / ``llaisys infer`` through the core command and its entry points."""

from __future__ import annotations

import importlib.metadata
import io
import json
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

import llaisys_models
from helpers.child_process import popen
from llaisys.cli import main

F32 = "f32_gqa2_hd32"


@pytest.fixture(autouse=True)
def _commands_installed():
    names = {ep.name for ep in importlib.metadata.entry_points(group="llaisys.commands")}
    if not {"generate", "infer"} <= names:
        pytest.skip("llaisys-models' commands are not registered (pip install ./llaisys-models)")


def test_generate_streams_text_and_reports_speed(tiny_models, device, capsys):
    path = tiny_models.path(F32)
    rc = main(["generate", "--model", str(path), "--device", str(device), "--prompt", "Hi there",
               "--max-new-tokens", "12"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    from llaisys_models.text.tokenizer import encode, load_tokenizer
    tokenizer = load_tokenizer(path)
    ids = encode(tokenizer, "Hi there")
    assert ids[:1] == [ord("<")], "the chat template was not applied"
    model = llaisys_models.load(path, device=device)
    want = tokenizer.decode(model.generate(ids, 12)[len(ids):], skip_special_tokens=True)
    assert out == want + "\n"
    assert "prefill:" in err and "decode:" in err and "tok/s" in err
    first_token_ms = re.search(r"\| first token after (\d+) ms \|", err)
    assert first_token_ms, f"no time to first token in the stats line: {err!r}"
    stats = model.last_stats  # (of the model above: its own run)
    assert 0 < stats.prefill_seconds <= stats.first_token_seconds < stats.prefill_seconds + 1.0  # (+ the set-up)


def test_generate_sampling_flags(tiny_models, device, capsys):
    args = ["generate", "--model", str(tiny_models.path(F32)), "--device", str(device), "--prompt", "x",
            "--max-new-tokens", "6", "--temperature", "0.8", "--top-p", "0.9", "--seed", "7", "--raw"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first


def test_generate_chat(tiny_models, device, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\nand again\n/exit\n"))
    rc = main(["generate", "--model", str(tiny_models.path(F32)), "--device", str(device), "--chat",
               "--max-new-tokens", "5"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert err.count("prefill:") == 2


def test_generate_without_model_uses_the_demo(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(llaisys_models, "DEMO_MODEL_DIR", tmp_path / "demo")
    assert main(["generate", "--prompt", "1+1="]) == 2
    err = capsys.readouterr().err
    assert "demo model is missing" in err and "--model" in err


def test_demo_model_adds(capsys):
    if not (llaisys_models.DEMO_MODEL_DIR / "config.json").is_file():
        pytest.skip("the demo model is not in this checkout yet")
    assert main(["generate", "--prompt", "12+34=", "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().out.strip() == "46"


def test_infer_test_matches_hf(tiny_models, device, capsys):
    rc = main(["infer", "--model", str(tiny_models.path(F32)), "--device", str(device), "--test",
               "--max-new-tokens", "16"])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    assert "PASS" in out and "HF transformers" in out


def test_infer_asks_a_model_a_question_by_default(tiny_models, device, capsys):
    """Without --prompt, --model gets a question (the demo's sum meant nothing to a chat model)."""
    path = tiny_models.path(F32)
    assert main(["infer", "--model", str(path), "--device", str(device), "--max-new-tokens", "4"]) == 0
    by_default = capsys.readouterr().out
    assert main(["infer", "--model", str(path), "--device", str(device), "--max-new-tokens", "4",
                 "--prompt", "What is the capital of France?"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == by_default.splitlines()[1:]  # (line 0: the time taken)
    assert main(["infer", "--model", str(path), "--device", str(device), "--max-new-tokens", "4",
                 "--prompt", "12+34="]) == 0
    assert capsys.readouterr().out.splitlines()[1:] != by_default.splitlines()[1:]


def test_infer_test_without_torch_names_the_cpu_wheels(tiny_models, device, capsys, monkeypatch):
    monkeypatch.setattr("llaisys_models.cli.generate._installed", lambda package: package != "torch")  # (torch missing)
    assert main(["infer", "--model", str(tiny_models.path(F32)), "--device", str(device), "--test",
                 "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "needs torch" in err and "--index-url https://download.pytorch.org/whl/cpu" in err


def test_infer_test_of_a_gguf_file_without_accelerate_says_so(tiny_models, device, capsys, monkeypatch, tmp_path):
    """transformers reads a GGUF file only with accelerate: a one-line error before anything loads, not its
    traceback after llaisys' half ran."""
    from helpers.gguf_files import write_tiny_gguf

    monkeypatch.setattr("llaisys_models.cli.generate._installed", lambda package: package != "accelerate")
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    assert main(["infer", "--model", str(path), "--device", str(device), "--test", "--max-new-tokens", "2"]) == 2
    out, err = capsys.readouterr()
    assert err.strip().splitlines() == ["llaisys: error: --test has HF transformers read the GGUF file, which it does "
                                        "only with accelerate installed: pip install accelerate"]
    assert out == ""  # (nothing ran)


def test_bad_model_dir_is_a_clean_error(tmp_path, capsys):
    assert main(["generate", "--model", str(tmp_path), "--prompt", "x"]) == 2
    assert "config.json" in capsys.readouterr().err


# -- first contact: what a new user tries on the demo ------------------------

DEMO = llaisys_models.DEMO_MODEL_DIR


@pytest.fixture
def demo():
    if not (DEMO / "config.json").is_file():
        pytest.skip("the demo model is not in this checkout yet")
    return DEMO


def chat(monkeypatch, capsys, stdin: bytes, *args) -> tuple[int, str, str]:
    """``llaisys generate --chat`` on the demo with ``stdin`` as the user's lines."""
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    rc = main(["generate", "--chat", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def answers(out: str) -> list[str]:
    """The replies, one a line (piped input: no '> ' prompts between them)."""
    return [line.strip() for line in out.splitlines() if line.strip()]


def test_demo_chat_answers_every_turn(demo, monkeypatch, capsys):
    """Each turn is a new problem for the demo (its template shows only the last message), so the
    answers are those of the problems asked alone."""
    problems = ["12+30=", "99+1=", "1234+5678=", "7+8="]
    rc, out, err = chat(monkeypatch, capsys, "\n".join(problems).encode() + b"\n")
    assert rc == 0, err
    alone = []
    for p in problems:
        assert main(["generate", "--prompt", p]) == 0
        alone.append(capsys.readouterr().out.strip())
    assert answers(out) == alone and "> " not in out  # piped: no prompts in the output
    assert alone == [str(eval(p[:-1])) for p in problems]  # the demo does add these
    assert err.count("prefill:") == len(problems)


def test_chat_survives_any_message(demo, monkeypatch, capsys):
    """Too long for the context, no token in the vocabulary, not UTF-8: each is said in one line and
    the chat goes on."""
    lines = [b"1" * 304, b"hello", b"\xff1+1=", b"12+34="]
    rc, out, err = chat(monkeypatch, capsys, b"\n".join(lines) + b"\n")
    assert rc == 0, err
    assert answers(out) == ["46"]
    notes = [line for line in err.splitlines() if line.startswith("llaisys:")]
    assert len(notes) == 3, err
    assert "too long" in notes[0] and "304-token" in notes[0] and "256 positions" in notes[0]
    assert "'hello'" in notes[1] and "tokenizer" in notes[1] and str(DEMO) in notes[1]
    assert "not valid UTF-8" in notes[2] and "0xff" in notes[2]
    assert "Traceback" not in err and "max_new_tokens" not in err


def test_chat_drops_the_oldest_exchanges_to_fit(tiny_models, device, monkeypatch, capsys):
    """A model whose template shows the whole conversation: it grows past the context, the oldest
    exchanges go, and every turn is still answered."""
    path = tiny_models.path(F32)  # 512 positions; each line below is ~100 tokens with the template
    lines = [f"message {i}: " + "word " * 18 for i in range(8)]
    rc, out, err = chat(monkeypatch, capsys, "\n".join(lines).encode() + b"\n", "--model", str(path), "--device",
                        str(device), "--max-new-tokens", "24")
    assert rc == 0, err
    assert err.count("prefill:") == len(lines)
    assert "oldest exchange" in err and "were dropped" in err


def test_chat_history_keeps_room_for_the_reply(tiny_models):
    from llaisys_models.text.chat_prompt import ChatHistory, TurnTooLong
    from llaisys_models.text.tokenizer import encode, load_tokenizer

    tokenizer = load_tokenizer(tiny_models.path(F32))
    history = ChatHistory(tokenizer, context_length=120, max_new_tokens=20)
    for i in range(5):
        message = f"question {i} " + "x" * 20
        turn = history.turn(message)
        kept = history.exchanges[turn.dropped:]
        messages = [m for u, a in kept for m in ({"role": "user", "content": u}, {"role": "assistant", "content": a})]
        assert turn.ids == encode(tokenizer, messages + [{"role": "user", "content": message}])
        assert len(turn.ids) + turn.max_new_tokens <= 120 and turn.max_new_tokens == 20
        history.add(turn, message, "y" * 15)
    assert len(history.exchanges) < 5, "the history never shrank"
    # one message that leaves less than the budget but some room: the budget shrinks
    turn = history.turn("z" * 95)
    assert turn.dropped == len(history.exchanges) and 1 <= turn.max_new_tokens < 20
    before = list(history.exchanges)
    with pytest.raises(TurnTooLong, match="too long"):
        history.turn("z" * 200)
    assert history.exchanges == before


def test_chat_with_no_new_tokens_is_refused_up_front(demo, monkeypatch, capsys):
    rc, out, err = chat(monkeypatch, capsys, b"1+1=\n", "--max-new-tokens", "0")
    assert rc == 2 and "--chat needs --max-new-tokens of at least 1" in err and "loaded" not in err


def test_generate_shrinks_the_default_budget_to_the_context(demo, capsys):
    prompt = "1" * 129  # 129 tokens; the demo has 256 positions: the default 128 does not fit
    assert main(["generate", "--prompt", prompt]) == 0, capsys.readouterr().err
    assert "new tokens" in capsys.readouterr().err
    assert main(["generate", "--prompt", prompt, "--max-new-tokens", "200"]) == 2
    err = capsys.readouterr().err
    assert "129 tokens" in err and "256" in err and "at most 127 new tokens fit" in err
    assert main(["generate", "--prompt", "1" * 300]) == 2
    assert "300 tokens" in capsys.readouterr().err


def test_max_new_tokens_zero_runs_nothing(demo, capsys):
    assert main(["generate", "--prompt", "12+34=", "--max-new-tokens", "0"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "prefill" not in err and "nothing to generate (the prompt is 6 tokens)" in err


def test_help_shows_every_default(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--max-new-tokens N most new tokens per answer (default: 128" in text
    for flag, default in (("--temperature", "1.0"), ("--top-p", "1.0"), ("--seed", "random"), ("--prompt", "12+34=")):
        assert re.search(rf"{flag} \S+ .*?\(default: '?{re.escape(default)}", text), flag
    with pytest.raises(SystemExit):
        main(["infer", "--help"])
    assert "(default: 64)" in capsys.readouterr().out


def test_model_path_that_is_a_file(demo, capsys):
    assert main(["generate", "--model", str(demo / "config.json")]) == 2
    err = capsys.readouterr().err
    assert "config.json is a file" in err and f"pass the directory that holds it: {demo}" in err
    assert "does not exist" not in err


def test_model_directory_without_tokenizer_names_the_files(demo, tmp_path, capsys):
    for name in ("config.json", "model.safetensors"):
        shutil.copy(demo / name, tmp_path / name)
    assert main(["generate", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no tokenizer files" in err and "tokenizer.json" in err and "input_ids" not in err


def test_prompt_without_tokens_names_prompt_and_tokenizer(demo, capsys):
    assert main(["generate", "--prompt", "hello"]) == 2
    err = capsys.readouterr().err
    assert "'hello'" in err and f"tokenizer from {demo}" in err and "input_ids" not in err


def test_prompt_that_is_not_utf8(demo, capsys):
    """Python hands undecodable command-line bytes over as lone surrogates."""
    assert main(["generate", "--prompt", b"1\xff+2=".decode("utf-8", "surrogateescape")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "llaisys: error: --prompt is not valid UTF-8 text: byte 0xff at character 1"


@pytest.mark.parametrize("flag, value", [("--temperature", "inf"), ("--temperature", "nan"), ("--top-p", "2"),
                                         ("--top-k", "-1"), ("--seed", str(2**64))])
def test_bad_sampling_flags_fail_before_loading(demo, capsys, flag, value):
    assert main(["generate", flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"llaisys: error: {flag} must be") and "loaded" not in err


def test_ctrl_c_during_start_up_exits_quietly(demo, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(llaisys_models, "load", interrupted)
    try:
        rc = main(["generate", "--prompt", "1+1="])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped the command as a KeyboardInterrupt (a traceback for the user)")
    assert rc == 130
    assert "Traceback" not in capsys.readouterr().err


def test_ctrl_c_in_a_chat_exits_quietly_with_130(demo):
    """A real SIGINT to a running ``llaisys generate --chat`` waiting for input."""
    proc = popen([sys.executable, "-m", "llaisys.cli", "generate", "--chat"], stdin=subprocess.PIPE,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.write(b"12+34=\n")
        proc.stdin.flush()
        assert proc.stdout.read(len("46")) == b"46"  # answered; the next input() is on its way
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err.decode()
    assert b"Traceback" not in err and b"KeyboardInterrupt" not in err


def test_chat_prompts_on_a_terminal(demo, monkeypatch, capsys):
    stdin = io.TextIOWrapper(io.BytesIO(b"12+34=\n"), encoding="utf-8")
    monkeypatch.setattr(stdin, "isatty", lambda: True)
    monkeypatch.setattr("sys.stdin", stdin)
    assert main(["generate", "--chat"]) == 0
    assert capsys.readouterr().out == "> 46\n> "


def test_ctrl_c_during_a_reply_stops_it_and_the_chat_goes_on(tiny_models, tmp_path):
    """A real SIGINT while a reply streams (a tiny model without EOS, context raised to 32k, so the reply runs
    until stopped): the reply ends, the chat reads the next line (/exit: status 0, where ending the chat on
    Ctrl-C gives 130)."""
    model = tmp_path / "model"
    shutil.copytree(tiny_models.path(F32), model)
    config = json.loads((model / "config.json").read_text())
    config.update(max_position_embeddings=1 << 15, eos_token_id=None)
    (model / "config.json").write_text(json.dumps(config))
    (model / "generation_config.json").unlink(missing_ok=True)
    proc = popen([sys.executable, "-m", "llaisys.cli", "generate", "--chat", "--model", str(model), "--device", "cpu",
                  "--max-new-tokens", str(30000)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.write(b"hello\n")
        proc.stdin.flush()
        assert proc.stdout.read(1)  # the reply has begun
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(b"/exit\n", timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err.decode()
    assert b"(stopped; Ctrl-C at the prompt ends the chat)" in err and b"Traceback" not in err
    assert err.count(b"prefill:") == 1  # the one reply, ended early
    new_tokens = int(re.search(rb"(\d+) new tokens", err).group(1))
    assert 0 < new_tokens < 30000


def test_signal_tests_hold_when_the_runner_ignores_sigint(pytestconfig):
    """The suite started in the background by a non-interactive shell (``cmd &``) inherits SIGINT as ignored:
    the Ctrl-C test above (and the serve fixture's SIGTERM) must not depend on how the runner started."""
    test = f"{__file__}::test_ctrl_c_in_a_chat_exits_quietly_with_130"
    backend = pytestconfig.getoption("--backend")
    runner = ("import signal, subprocess, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
              "sys.exit(subprocess.run(sys.argv[1:]).returncode)")
    command = [sys.executable, "-c", runner, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test]
    result = subprocess.run(command + ([f"--backend={backend}"] if backend else []), capture_output=True, text=True,
                            timeout=300, cwd=pytestconfig.rootpath)
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout[-3000:] + result.stderr[-2000:]

# -- --quantize int8 ----------------------------------------------------------------------------------------------

def test_generate_with_int8_weights(demo, capsys):
    from helpers import skip_without_kernels

    skip_without_kernels("cpu", ["linear_i8"], "--quantize int8")
    assert main(["generate", "--device", "cpu", "--quantize", "int8", "--prompt", "12+34=", "--max-new-tokens", "8"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "46"
    assert "as bfloat16 with int8 weights" in err


def test_quantize_is_offered_and_checked(capsys):
    for command in ("generate", "infer", "serve"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        assert "--quantize {int8,int4}" in out and "--dequantize" in out, command
    with pytest.raises(SystemExit) as e:
        main(["generate", "--quantize", "int3", "--prompt", "1+1="])
    assert e.value.code == 2 and "argument --quantize: invalid choice: 'int3'" in capsys.readouterr().err


def test_infer_test_refuses_int8(demo, capsys):
    assert main(["infer", "--test", "--quantize", "int8"]) == 2
    assert "--test checks llaisys against HF transformers token for token" in capsys.readouterr().err


# -- --kv-cache-dtype ------------------------------------------------------------------------------------------

def test_generate_with_an_int8_kv_cache(demo, capsys):
    """The demo model adds as well with its keys and values in int8."""
    assert main(["generate", "--device", "cpu", "--kv-cache-dtype", "int8", "--prompt", "12+34=",
                 "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().out.strip() == "46"


def test_kv_cache_dtype_is_offered_and_checked(demo, capsys):
    for command in ("generate", "serve"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "--kv-cache-dtype {auto,int8,fp8}" in capsys.readouterr().out, command
    with pytest.raises(SystemExit) as e:
        main(["generate", "--kv-cache-dtype", "fp4", "--prompt", "1+1="])
    assert e.value.code == 2 and "argument --kv-cache-dtype: invalid choice: 'fp4'" in capsys.readouterr().err
    assert main(["infer", "--test", "--kv-cache-dtype", "int8"]) == 2
    assert "--kv-cache-dtype int8 departs from by design" in capsys.readouterr().err
