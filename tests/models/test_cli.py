"""``llaisys generate`` / ``llaisys infer`` through the core command and its entry points."""

from __future__ import annotations

import importlib.metadata
import io

import pytest

import llaisys_models
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
    from llaisys_models.tokenizer import encode, load_tokenizer
    tokenizer = load_tokenizer(path)
    ids = encode(tokenizer, "Hi there")
    assert ids[:1] == [ord("<")], "the chat template was not applied"
    model = llaisys_models.load(path, device=device)
    want = tokenizer.decode(model.generate(ids, 12)[len(ids):], skip_special_tokens=True)
    assert out == want + "\n"
    assert "prefill:" in err and "decode:" in err and "tok/s" in err


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


def test_bad_model_dir_is_a_clean_error(tmp_path, capsys):
    assert main(["generate", "--model", str(tmp_path), "--prompt", "x"]) == 2
    assert "config.json" in capsys.readouterr().err
