"""Hub ids (``--model org/name``, ``llaisys_models.load("org/name")``) through a Hugging Face cache laid out as
huggingface_hub lays it (models--org--name/refs/main, snapshots/<commit>/ links into blobs/), in a tmp dir.

The network is never reached: the Hub endpoint is an unreachable local port, and where a test needs the Hub
to answer, huggingface_hub's calls are replaced by fakes that serve a local checkpoint.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import time
from pathlib import Path

import pytest
from huggingface_hub import constants

import llaisys_models
from helpers.child_process import run_in_child
from llaisys.cli import main
from llaisys_models.errors import ModelLoadError
from llaisys_models.loading.hub import HubId, parse, pick

F32 = "f32_gqa2_hd32"
SHARDED = "bf16_gqa4_hd128_sharded"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: a connection attempt is refused at once


def add_to_cache(cache: Path, repo: str, files: dict[str, Path], commit: str = COMMIT, refs=("main",)) -> Path:
    """Put ``files`` (repo path -> local file) in ``cache`` as huggingface_hub stores a download: each file a
    blob named by its hash, linked from snapshots/<commit>/; refs/<ref> holds the commit."""
    storage = cache / ("models--" + repo.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    for name, source in files.items():
        data = source.read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (storage / "refs").mkdir(parents=True, exist_ok=True)
        (storage / "refs" / ref).write_text(commit)
    return snapshot


def model_files(directory: Path) -> dict[str, Path]:
    return {p.name: p for p in directory.iterdir() if p.is_file()}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty Hub cache in a tmp dir, HF_HUB_OFFLINE unset and the Hub unreachable; ``hub.offline()`` sets
    HF_HUB_OFFLINE (huggingface_hub reads both at import: its constants are set too)."""
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    for name, value in (("HF_HOME", str(tmp_path / "hf")), ("HF_HUB_CACHE", str(cache)), ("HF_ENDPOINT", UNREACHABLE)):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", UNREACHABLE)
    connect = socket.socket.connect

    def loopback_only(self, address):  # whatever reads the endpoint, the real Hub is never reached
        if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            raise AssertionError(f"a test connected to {address}")
        return connect(self, address)
    monkeypatch.setattr(socket.socket, "connect", loopback_only)

    class Hub:
        root = cache

        @staticmethod
        def offline():
            monkeypatch.setenv("HF_HUB_OFFLINE", "1")
            monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return Hub


@pytest.fixture
def no_network(monkeypatch):
    """Every huggingface_hub call that could reach the Hub fails the test."""
    import huggingface_hub

    def forbidden(*args, **kwargs):
        raise AssertionError("the Hub was asked although the cache holds the model")
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", forbidden)
    for name in ("snapshot_download", "hf_hub_download"):
        monkeypatch.setattr(huggingface_hub, name, forbidden)


def test_ids_and_paths_parse_apart():
    assert parse("Qwen/Qwen2.5-0.5B-Instruct") == HubId("Qwen/Qwen2.5-0.5B-Instruct")
    assert parse("org/name-GGUF:Q4_K_M") == HubId("org/name-GGUF", None, "Q4_K_M")
    assert parse("org/name@v1.0:model.gguf") == HubId("org/name", "v1.0", "model.gguf")
    for path in ("model", "./org/name", "/abs/path", "~/models/x", "a/b/c", "org/../name", "org--x/name", "org/name/",
                 "org/name@../../x"):
        assert parse(path) is None, path


def test_offline_cache_hit_loads_the_cached_model(hub, tiny_models, no_network):
    hub.offline()
    add_to_cache(hub.root, "org/tiny", model_files(tiny_models.path(F32)))
    model = llaisys_models.load("org/tiny", device="cpu")
    assert model.path == hub.root / "models--org--tiny" / "snapshots" / COMMIT
    local = llaisys_models.load(tiny_models.path(F32), device="cpu")
    prompt = [1, 2, 3, 40, 50]
    assert model.generate(prompt, 8) == local.generate(prompt, 8)
    assert llaisys_models.load_tokenizer("org/tiny")("hello").input_ids == list(b"hello")


def test_cache_hit_online_never_asks_the_hub(hub, tiny_models, no_network, capsys):
    """Not offline, the Hub unreachable and every Hub call forbidden: the CLI answers from the cache."""
    add_to_cache(hub.root, "org/tiny", model_files(tiny_models.path(F32)))
    args = ["generate", "--device", "cpu", "--prompt", "Hi", "--max-new-tokens", "6"]
    assert main([*args, "--model", "org/tiny"]) == 0
    from_hub = capsys.readouterr().out
    assert main([*args, "--model", str(tiny_models.path(F32))]) == 0
    assert from_hub == capsys.readouterr().out and from_hub.strip()


def test_revisions_name_refs_and_commits(hub, tiny_models, no_network):
    hub.offline()
    add_to_cache(hub.root, "org/tiny", model_files(tiny_models.path(F32)), refs=("v1",))
    snapshot = hub.root / "models--org--tiny" / "snapshots" / COMMIT
    assert llaisys_models.load("org/tiny@v1", device="cpu").path == snapshot
    assert llaisys_models.load(f"org/tiny@{COMMIT}", device="cpu").path == snapshot
    with pytest.raises(ModelLoadError, match="not in the local cache"):  # no refs/main
        llaisys_models.load("org/tiny", device="cpu")


def test_offline_miss_is_one_line_naming_the_id_and_hf_hub_offline(hub, no_network, capsys):
    hub.offline()
    assert main(["generate", "--model", "org/absent", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("llaisys: error: org/absent ")
    assert "HF_HUB_OFFLINE" in err and str(hub.root) in err and "Traceback" not in err


def test_offline_partial_copy_names_what_it_lacks(hub, tiny_models, no_network):
    hub.offline()
    files = model_files(tiny_models.path(F32))
    del files["model.safetensors"]
    add_to_cache(hub.root, "org/tiny", files)
    with pytest.raises(ModelLoadError, match="lacks model.safetensors.*HF_HUB_OFFLINE"):
        llaisys_models.load("org/tiny", device="cpu")


def test_online_miss_with_the_hub_unreachable_fails_fast(hub):
    t0 = time.perf_counter()
    unreachable = r"org/absent .*127\.0\.0\.1:9.*cannot be reached: Connect.*HF_HUB_OFFLINE"  # refused, not the guard
    with pytest.raises(ModelLoadError, match=unreachable) as e:
        llaisys_models.load("org/absent", device="cpu")
    assert time.perf_counter() - t0 < 30
    assert "\n" not in str(e.value)


def test_a_local_path_wins_over_the_hub_id(hub, tiny_models, tmp_path, monkeypatch, no_network):
    hub.offline()
    add_to_cache(hub.root, "org/tiny", model_files(tiny_models.path(F32)))
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_models.path("llama_f32_tied"), tmp_path / "org" / "tiny")
    model = llaisys_models.load("org/tiny", device="cpu")
    assert model.path == Path("org/tiny") and model.config.architecture == "LlamaForCausalLM"


def test_gguf_repo_picks_a_file_by_tag_or_name(hub, tiny_models, tmp_path, no_network):
    from gguf import GGMLQuantizationType as Q

    from helpers.gguf_files import write_gguf

    hub.offline()
    files = {}
    for qtype in (Q.Q8_0, Q.F16):
        name = f"tiny-{qtype.name.lower()}.gguf"
        files[name] = write_gguf(tiny_models.hf(F32), tiny_models.path(F32), tmp_path / name, qtype)
    snapshot = add_to_cache(hub.root, "org/tiny-GGUF", {**files, "README.md": tmp_path / "tiny-f16.gguf"})
    prompt = [5, 6, 7]
    for spec in ("org/tiny-GGUF:Q8_0", "org/tiny-GGUF:tiny-q8_0.gguf", "org/tiny-GGUF:q8_0"):
        model = llaisys_models.load(spec, device="cpu")
        assert model.path == snapshot / "tiny-q8_0.gguf"
    direct = llaisys_models.load(files["tiny-q8_0.gguf"], device="cpu")
    assert model.generate(prompt, 6) == direct.generate(prompt, 6)
    with pytest.raises(ModelLoadError, match=r"2 \.gguf files: name one as org/tiny-GGUF:TAG.*tiny-f16\.gguf"):
        llaisys_models.load("org/tiny-GGUF", device="cpu")
    with pytest.raises(ModelLoadError, match="no .gguf file named or tagged 'Q4_K_M'.*HF_HUB_OFFLINE"):
        llaisys_models.load("org/tiny-GGUF:Q4_K_M", device="cpu")


def test_pick_from_a_hub_listing():
    """What a repo's file list resolves to: weights beat .gguf files unless a file is named; tags match
    between separators only."""
    st = ["config.json", "model.safetensors", "tokenizer.json", "README.md", "q4_k_m.gguf"]
    assert pick(st, HubId("o/n")) == (".", "")
    assert pick(st, HubId("o/n", file="Q4_K_M")) == ("q4_k_m.gguf", "")
    assert pick(["config.json", "tokenizer.json"], HubId("o/n")) == (None, "model.safetensors")
    ggufs = ["m-Q4_K_M.gguf", "m-Q4_K_S.gguf", "sub/m.Q8_0.gguf", "m-Q8_0-00001-of-00002.gguf"]
    assert pick(ggufs, HubId("o/n", file="q4_k_s")) == ("m-Q4_K_S.gguf", "")
    assert pick(ggufs, HubId("o/n", file="m.Q8_0.gguf")) == ("sub/m.Q8_0.gguf", "")
    with pytest.raises(ModelLoadError, match="'q8_0' matches 2 .gguf files.*name one by its file name"):
        pick(ggufs, HubId("o/n", file="q8_0"))
    with pytest.raises(ModelLoadError, match="no .gguf file named or tagged 'Q4_K'"):
        pick(ggufs, HubId("o/n", file="Q4_K"))
    with pytest.raises(ModelLoadError, match="holds no .gguf file"):
        pick(st[:3], HubId("o/n", file="Q8_0"))


def test_download_fetches_only_what_a_model_needs(hub, tiny_models, monkeypatch, capsys):
    """Online and not cached: the listing's model files are fetched (the shards the index names, not
    another copy of the weights, not the README, not a subfolder's), then the model loads from the cache,
    and a second load, offline, needs no Hub."""
    import huggingface_hub
    from huggingface_hub.hf_api import ModelInfo

    source = tiny_models.path(SHARDED)
    listing = [*model_files(source), "README.md", "consolidated.safetensors", "onnx/model.safetensors"]
    fetched = []

    def model_info(self, repo_id, revision=None, files_metadata=False, **kwargs):
        assert (repo_id, revision, files_metadata) == ("org/sharded", "main", True)
        return ModelInfo(id=repo_id, sha=COMMIT, siblings=[{"rfilename": f, "size": 1} for f in listing])

    def store(names):  # what huggingface_hub does on a download: blobs, snapshot links, refs/main
        fetched.extend(names)
        return add_to_cache(hub.root, "org/sharded", {n: source / n for n in names})

    def hf_hub_download(repo_id, filename, revision=None, **kwargs):
        return str(store([filename]) / filename)

    def snapshot_download(repo_id, revision=None, allow_patterns=None, **kwargs):
        return str(store([f for f in allow_patterns if f not in fetched]))
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)

    model = llaisys_models.load("org/sharded", device="cpu")
    assert sorted(fetched) == sorted(model_files(source))
    assert "downloading org/sharded (" in capsys.readouterr().err
    hub.offline()
    again = llaisys_models.load("org/sharded", device="cpu")
    assert again.path == model.path
    prompt = [9, 8, 7]
    assert again.generate(prompt, 6) == llaisys_models.load(source, device="cpu").generate(prompt, 6)


def test_hf_hub_offline_from_the_environment(hub, tiny_models):
    """The variables as a user sets them (huggingface_hub reads them at import): a fresh interpreter."""
    add_to_cache(hub.root, "org/tiny", model_files(tiny_models.path(F32)))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    child = run_in_child(generate_hit_and_miss, env=env, timeout=300)
    assert child.returncode == 0, child.stderr
    hit, miss = child.stdout.rsplit("\n", 2)[-2].split(" ")
    assert (hit, miss) == ("0", "2"), child.stderr
    assert child.stderr.count("llaisys: error: org/absent ") == 1 and "HF_HUB_OFFLINE" in child.stderr
    assert "Traceback" not in child.stderr


def generate_hit_and_miss() -> None:
    """(child) ``llaisys generate`` on a cached id, then on one not cached; prints both exit statuses."""
    args = ["generate", "--device", "cpu", "--prompt", "Hi", "--max-new-tokens", "4", "--model"]
    hit = main([*args, "org/tiny"])
    miss = main([*args, "org/absent"])
    print(f"\n{hit} {miss}")


def test_serve_names_the_model_by_its_hub_id(hub, tiny_models, no_network):
    from llaisys_models.cli.generate import model_dir
    from llaisys_models.serve.launch import default_model_name

    hub.offline()
    snapshot = add_to_cache(hub.root, "org/tiny", model_files(tiny_models.path(F32)))

    class Args:
        model = Path("org/tiny")
    assert model_dir(Args) == snapshot
    assert default_model_name(snapshot, Args.model) == "org/tiny"
    assert default_model_name(tiny_models.path(F32), tiny_models.path(F32)) == F32
