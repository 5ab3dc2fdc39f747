"""``llaisys generate --lora PATH``: the reply of the model under the adapter (``model.generate(..., lora=...)``'s
tokens), with --prompt and with --chat; the adapter's slots sized to its rank (a rank over the server's default
16 loads too); an adapter that cannot load is a one-line error naming --lora."""

from __future__ import annotations

import importlib.metadata
import io

import pytest

import llaisys_models
from helpers.lora_adapters import AdapterSpec, TinyAdapters, make_adapter
from llaisys.cli import main

F32 = "f32_gqa2_hd32"
PROMPT = "Hi there"


@pytest.fixture(autouse=True)
def _commands_installed():
    names = {ep.name for ep in importlib.metadata.entry_points(group="llaisys.commands")}
    if "generate" not in names:
        pytest.skip("llaisys-models' commands are not registered (pip install ./llaisys-models)")


@pytest.fixture(scope="module")
def adapters(tiny_models, tmp_path_factory) -> TinyAdapters:
    return TinyAdapters(tiny_models, tmp_path_factory.mktemp("lora_cli"))


def expected(path, device, adapter, n: int = 16) -> tuple[str, str]:
    """(the reply under ``adapter``, the base model's reply) to PROMPT through the chat template, as text."""
    from llaisys_models.text.tokenizer import encode, load_tokenizer

    tokenizer = load_tokenizer(path)
    ids = encode(tokenizer, PROMPT)
    model = llaisys_models.load(path, device=device)
    model.enable_lora(max_loras=1, max_lora_rank=64)
    model.load_lora("adapter", adapter)
    under, base = model.generate(ids, n, lora="adapter"), model.generate(ids, n)
    assert under != base, "the adapter changed nothing"
    return (tokenizer.decode(under[len(ids):], skip_special_tokens=True),
            tokenizer.decode(base[len(ids):], skip_special_tokens=True))


def test_generate_runs_the_prompt_under_the_adapter(tiny_models, adapters, device, capsys):
    path, adapter = tiny_models.path(F32), adapters.path(F32, "all_r8")
    rc = main(["generate", "--model", str(path), "--device", str(device), "--prompt", PROMPT, "--max-new-tokens", "16",
               "--lora", str(adapter)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out == expected(path, device, adapter)[0] + "\n"
    assert f"LoRA adapter {adapter}: rank 8, " in err


def test_chat_runs_under_the_adapter(tiny_models, adapters, device, capsys, monkeypatch):
    path, adapter = tiny_models.path(F32), adapters.path(F32, "qv_r16_rslora")
    monkeypatch.setattr("sys.stdin", io.StringIO(PROMPT + "\n/exit\n"))
    rc = main(["generate", "--chat", "--model", str(path), "--device", str(device), "--max-new-tokens", "16",
               "--lora", str(adapter)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out == expected(path, device, adapter)[0] + "\n"  # (the first turn: the prompt through the template)


def test_an_adapter_of_a_rank_over_16_loads(tiny_models, tmp_path, device, capsys):
    path = tiny_models.path(F32)
    adapter = make_adapter(path, tmp_path / "r32", AdapterSpec(r=32, alpha=32, targets=("q_proj", "down_proj"), seed=7))
    rc = main(["generate", "--model", str(path), "--device", str(device), "--prompt", PROMPT, "--max-new-tokens", "8",
               "--lora", str(adapter)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out == expected(path, device, adapter, 8)[0] + "\n"
    assert "rank 32" in err


def test_an_adapter_that_cannot_load_is_one_line(tiny_models, tmp_path, device, capsys):
    rc = main(["generate", "--model", str(tiny_models.path(F32)), "--device", str(device), "--prompt", PROMPT,
               "--lora", str(tmp_path / "no-such-adapter")])
    err = capsys.readouterr().err
    assert rc == 2
    line = err.splitlines()[-1]
    assert line.startswith(f"llaisys: error: --lora {tmp_path / 'no-such-adapter'}: "), err
    assert "Traceback" not in err
