"""Models named by a Hugging Face Hub id: the local cache first, else a download (huggingface_hub).

    llaisys_models.load("Qwen/Qwen2.5-0.5B-Instruct")              # config.json, safetensors, tokenizer
    llaisys_models.load("Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M")  # a GGUF repo: the file of that quantization
    llaisys_models.load("org/name@v1.0")                           # a branch, tag or commit (default: main)

An id is ``org/name[@revision][:file]``. ``file`` picks a .gguf file of the repo: its name
(``org/name:model-q8_0.gguf``) or a tag its name holds between "-" or "." (``Q4_K_M``, ``q8_0``:
case-insensitive). A repo of one .gguf file and no safetensors needs none.

A path that exists always wins: ``resolve`` returns it as it is, and so any string that is not an id.
The cache is huggingface_hub's (``HF_HUB_CACHE``, else ``HF_HOME``/hub, else ~/.cache/huggingface/hub):
a model there (refs/<revision> -> snapshots/<commit>/) with every file llaisys reads loads without any
network access; else, unless ``HF_HUB_OFFLINE`` is set, those files alone are downloaded into it (with
a progress bar). A cached model is not refreshed: ``hf download org/name`` does that.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import ParamSpec, TypeVar

from ..errors import ModelLoadError
from .files import TOKENIZER_FILES, VOCABULARY_FILES, PathArg
from .safetensors import _weight_map

INDEX_FILE = "model.safetensors.index.json"
# What a safetensors model is read from, beside its weights (each fetched when the repo has it; a GPTQ / AWQ
# checkpoint's quantization config may be a file of its own: quantized_checkpoint.py)
MODEL_FILES = ("config.json", "generation_config.json", INDEX_FILE, *TOKENIZER_FILES, "quantize_config.json",
               "quant_config.json")

_NAME = r"[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9_])?"
_ID = re.compile(rf"(?P<repo>{_NAME}/{_NAME})(?:@(?P<revision>[^:@\s]+))?(?::(?P<file>[^:@\s]+))?")


@dataclasses.dataclass(frozen=True)
class HubId:
    repo: str  # "org/name"
    revision: str | None = None  # None: main
    file: str | None = None  # a .gguf file's name, or a tag in it

    def __str__(self) -> str:
        return self.repo + (f"@{self.revision}" if self.revision else "") + (f":{self.file}" if self.file else "")


def parse(spec: PathArg) -> HubId | None:
    """The Hub id ``spec`` spells, or None when it cannot be one (then it is only a path)."""
    match = _ID.fullmatch(str(spec))
    if match is None or ".." in match["repo"] or "--" in match["repo"]:  # the Hub allows neither
        return None
    if match["revision"] and ".." in match["revision"].split("/"):  # a revision names a file under refs/
        return None
    return HubId(match["repo"], match["revision"], match["file"])


def resolve(spec: PathArg) -> Path:
    """The local path of the model ``spec`` names: ``spec`` itself when it exists or is no Hub id, else the
    model's directory (or .gguf file) in the Hub cache, downloaded there first when it is missing."""
    path = Path(spec)
    hub_id = None if path.exists() else parse(spec)
    if hub_id is None:
        return path
    from huggingface_hub import constants  # ~0.1 s: only for an id

    snapshot = cached_snapshot(hub_id, Path(constants.HF_HUB_CACHE))
    missing = "it is not in the local cache"
    if snapshot is not None:
        try:
            found, lack = pick(_files_in(snapshot), hub_id, snapshot)
        except ModelLoadError as e:  # e.g. no .gguf of that tag here: the Hub may hold it
            if constants.HF_HUB_OFFLINE:
                raise ModelLoadError(f"{e} (in the local cache; HF_HUB_OFFLINE is set)") from None
            found, lack = None, "the file named"
        if found is not None:
            return snapshot / found
        missing = f"its copy in the local cache lacks {lack}"
    if constants.HF_HUB_OFFLINE:
        raise ModelLoadError(f"{spec} is not a file or directory, and {missing} ({constants.HF_HUB_CACHE}): "
                             f"HF_HUB_OFFLINE is set, so it cannot be downloaded; unset HF_HUB_OFFLINE to "
                             f"download it from the Hugging Face Hub, or pass a local path")
    return download(hub_id, missing)


def cached_snapshot(hub_id: HubId, cache: Path) -> Path | None:
    """The cache's snapshot folder of ``hub_id``'s revision (as huggingface_hub lays it out), or None."""
    storage = cache / ("models--" + hub_id.repo.replace("/", "--"))
    revision = hub_id.revision or "main"
    commit = revision
    if not re.fullmatch(r"[0-9a-f]{40}", revision):
        ref = storage / "refs" / revision
        if not ref.is_file():
            return None
        commit = ref.read_text(encoding="utf-8", errors="replace").strip()
    snapshot = storage / "snapshots" / commit
    return snapshot if commit and snapshot.is_dir() else None


def _files_in(snapshot: Path) -> list[str]:
    """The regular files (links followed) under ``snapshot``, as repo paths."""
    return sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())


def pick(files: list[str], hub_id: HubId, snapshot: Path | None = None) -> tuple[str | None, str]:
    """What to load of a repo holding ``files``: (".", "") for its safetensors model, (path, "") for a .gguf
    file of it, or (None, what is missing). ``snapshot``: the folder the files are in (a cached copy: its
    index says which shards it needs); None: a listing of the Hub. An id that cannot name a model of the
    repo (no such .gguf, several for a tag) is a ModelLoadError."""
    ggufs = [f for f in files if f.lower().endswith(".gguf")]
    if hub_id.file is not None or (ggufs and not _has_weights(files)):
        return _pick_gguf(ggufs, hub_id), ""
    lack = [name for name in ("config.json",) if name not in files]
    if not _has_weights(files):
        lack.append("model.safetensors")
    elif snapshot is not None and INDEX_FILE in files:
        lack += [shard for shard in shards(snapshot / INDEX_FILE) if shard not in files]
    if not any(name in files for name in VOCABULARY_FILES):
        lack.append("tokenizer.json")
    return (None, ", ".join(lack)) if lack else (".", "")


def _has_weights(files: list[str]) -> bool:
    return any("/" not in f and f.endswith(".safetensors") for f in files)


def _pick_gguf(ggufs: list[str], hub_id: HubId) -> str:
    if not ggufs:
        raise ModelLoadError(f"{hub_id} names a file, but {hub_id.repo} holds no .gguf file; leave ':{hub_id.file}' "
                             f"out to load its safetensors model" if hub_id.file else
                             f"{hub_id.repo} holds neither safetensors weights nor a .gguf file")
    if hub_id.file is None:
        if len(ggufs) == 1:
            return ggufs[0]
        raise ModelLoadError(f"{hub_id.repo} holds {len(ggufs)} .gguf files: name one as {hub_id.repo}:TAG (a "
                             f"quantization such as Q4_K_M) or {hub_id.repo}:FILE; {_choices(ggufs)}")
    want = hub_id.file.lower()
    named = [f for f in ggufs if f.lower() == want or PurePosixPath(f).name.lower() == want]
    tag = re.compile(rf"(^|[-.]){re.escape(want)}([-.]|$)")  # "-" / "." only: "_" is inside tags (Q4_K_M)
    tagged = named or [f for f in ggufs if tag.search(PurePosixPath(f).name[:-len(".gguf")].lower())]
    if len(tagged) == 1:
        return tagged[0]
    if not tagged:
        raise ModelLoadError(f"{hub_id.repo} holds no .gguf file named or tagged {hub_id.file!r}; {_choices(ggufs)}")
    raise ModelLoadError(f"{hub_id.file!r} matches {len(tagged)} .gguf files of {hub_id.repo} (llaisys reads a model "
                         f"of one file): name one by its file name; {_choices(tagged)}")


def _choices(files: list[str]) -> str:
    shown = ", ".join(files[:8])
    return f"the choices: {shown}" + (f" and {len(files) - 8} more" if len(files) > 8 else "")


def shards(index: Path) -> list[str]:
    """The shard files a safetensors index names."""
    return sorted(set(_weight_map(index).values()))


def download(hub_id: HubId, missing: str) -> Path:
    """Fetch the files of ``hub_id``'s model into the Hub cache (progress bars on stderr); its local path."""
    from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download

    where = f"{hub_id} is not a file or directory and {missing}"
    revision = hub_id.revision or "main"
    info = _hub_call(hub_id, where, HfApi().model_info, hub_id.repo, revision=revision, files_metadata=True)
    sizes = {s.rfilename: s.size or 0 for s in info.siblings or ()}
    found, lack = pick(list(sizes), hub_id)
    if found is None:
        raise ModelLoadError(f"{hub_id.repo} on the Hugging Face Hub is not a model llaisys loads: it lacks {lack} "
                             f"(a model is config.json, safetensors weights and a tokenizer, or a .gguf file)")
    if found != ".":
        fetch = [found]
    elif INDEX_FILE in sizes:  # the shards the index names (a repo may hold other copies of the weights)
        index = _hub_call(hub_id, where, hf_hub_download, hub_id.repo, INDEX_FILE, revision=revision)
        fetch = [f for f in MODEL_FILES if f in sizes] + shards(Path(index))
    else:
        fetch = [f for f in sizes if f in MODEL_FILES or ("/" not in f and f.endswith(".safetensors"))]
    total = sum(sizes.get(f, 0) for f in fetch)
    print(f"llaisys: downloading {hub_id} ({len(fetch)} files, {total / 2**30:.2f} GiB) from the Hugging Face Hub "
          f"into {constants.HF_HUB_CACHE}", file=sys.stderr, flush=True)
    snapshot = _hub_call(hub_id, where, snapshot_download, hub_id.repo, revision=revision, allow_patterns=fetch)
    return Path(snapshot) / found


_P = ParamSpec("_P")
_T = TypeVar("_T")


def _hub_call(hub_id: HubId, where: str, function: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """``function(*args, **kwargs)`` of huggingface_hub, each way it can fail as a one-line ModelLoadError."""
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        return function(*args, **kwargs)
    except GatedRepoError:
        raise ModelLoadError(f"{hub_id.repo} is gated on the Hugging Face Hub: accept its terms at "
                             f"{constants.ENDPOINT}/{hub_id.repo} and log in (hf auth login, or set HF_TOKEN)") from None
    except RepositoryNotFoundError:
        raise ModelLoadError(f"{where}, and the Hugging Face Hub has no model {hub_id.repo} (a private one needs "
                             f"hf auth login, or HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise ModelLoadError(f"{hub_id.repo} has no revision {hub_id.revision!r} on the Hugging Face Hub") from None
    except HfHubHTTPError as e:
        raise ModelLoadError(f"{where}, and the Hugging Face Hub refused it: {_first_line(e)}") from None
    except Exception as e:  # the network: connection refused, timeouts, DNS, proxies (httpx / requests)
        raise ModelLoadError(f"{where}, and the Hugging Face Hub ({constants.ENDPOINT}) cannot be reached: "
                             f"{type(e).__name__}: {_first_line(e)}; connect, or download it elsewhere (set "
                             f"HF_HUB_OFFLINE=1 to use the cache alone)") from None


def _first_line(e: Exception) -> str:
    line = (str(e).strip().splitlines() or [""])[0]
    return line if len(line) <= 200 else line[:197] + "..."
