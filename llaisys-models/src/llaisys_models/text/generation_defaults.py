"""The sampling settings a model ships with, used wherever the caller leaves one unset.

Two places hold them: a HuggingFace directory's ``generation_config.json`` (what HF transformers' ``generate``
and vLLM's server start from) and a GGUF file's ``general.sampling.*`` metadata (what llama.cpp starts from).
Qwen2.5-Instruct, for one, ships temperature 0.7, top_p 0.8, top_k 20 and a repetition penalty of 1.05; its
replies are what its authors tuned with those, and greedy decoding of a small model tends to repeat itself.

The text interfaces apply them: ``llaisys generate`` (``--generation-config none`` turns them off),
``model.chat`` / ``model.complete`` and the server, setting by setting, for what the caller does not give.
``model.generate`` (token ids in and out) never does: it is greedy unless asked, token for token HF's greedy.

generation_config.json is read as HF reads it: with ``do_sample`` false (its default) the reply is greedy and
only ``repetition_penalty`` applies; with ``do_sample`` true, temperature, top_p and top_k (HF's default: 50)
apply. A GGUF file's ``general.sampling.temp`` / ``top_k`` / ``top_p`` / ``penalty_repeat`` apply as given
(temp 0 is greedy). Settings llaisys has no equivalent for (min_p, typical_p, ...) are not applied; ``describe``
names them. A value out of range is an error naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TypedDict

from llaisys import LlaisysValueError

HF_FILE = "generation_config.json"
HF_TOP_K = 50  # HF GenerationConfig's top_k where a sampling config names none
# GGUF metadata key -> setting (llama.cpp's gguf constants)
GGUF_KEYS = {"general.sampling.temp": "temperature", "general.sampling.top_k": "top_k",
             "general.sampling.top_p": "top_p", "general.sampling.penalty_repeat": "repetition_penalty"}
# what some files carry that llaisys does not sample with (said by describe(), not silently dropped)
HF_UNSUPPORTED = ("min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "no_repeat_ngram_size")
GGUF_UNSUPPORTED = ("general.sampling.min_p", "general.sampling.xtc_probability", "general.sampling.mirostat")


class Settings(TypedDict):
    """The sampling settings ``GenerationDefaults.fill`` returns (None: neither the caller nor the model gives one)."""
    top_k: int | None
    top_p: float | None
    temperature: float | None
    repetition_penalty: float | None


@dataclasses.dataclass(frozen=True)
class GenerationDefaults:
    """Sampling settings of a model (None: the model says nothing; llaisys' default applies)."""
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    source: str = ""  # where they were read, for messages
    ignored: tuple[str, ...] = ()  # settings the file holds that llaisys does not apply

    def settings(self) -> dict:
        """The settings the model gives, by name (temperature, top_k, top_p, repetition_penalty)."""
        return {f: getattr(self, f) for f in ("temperature", "top_k", "top_p", "repetition_penalty")
                if getattr(self, f) is not None}

    def fill(self, *, top_k: int | None = None, top_p: float | None = None, temperature: float | None = None,
             repetition_penalty: float | None = None) -> Settings:
        """The settings given (value or None), each None taken from the model where it has one."""
        return Settings(top_k=self.top_k if top_k is None else top_k, top_p=self.top_p if top_p is None else top_p,
                        temperature=self.temperature if temperature is None else temperature,
                        repetition_penalty=self.repetition_penalty if repetition_penalty is None
                        else repetition_penalty)

    def describe(self) -> str:
        """'temperature 0.7, top_k 20 (generation_config.json)', or '' when the model gives nothing."""
        text = ", ".join(f"{name} {value:g}" for name, value in self.settings().items())
        if self.ignored:
            text += ("; " if text else "") + f"not applied: {', '.join(self.ignored)}"
        return f"{text} ({self.source})" if text else ""


NONE = GenerationDefaults()


def read(path: Path, gguf_metadata: dict | None = None) -> GenerationDefaults:
    """The defaults of the model at ``path``: its GGUF metadata (``gguf_metadata``, for a GGUF file), else the
    directory's generation_config.json, else none."""
    if gguf_metadata is not None:
        return from_gguf(gguf_metadata, Path(path).name)
    config = Path(path) / HF_FILE
    if not config.is_file():
        return NONE
    try:
        values = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, ValueError) as e:
        raise LlaisysValueError(f"{config}: not readable as JSON ({e})") from None
    if not isinstance(values, dict):
        raise LlaisysValueError(f"{config}: expected a JSON object, got {type(values).__name__}")
    return from_generation_config(values, str(config))


def from_generation_config(values: dict, where: str = HF_FILE) -> GenerationDefaults:
    """HF's reading of a generation_config.json's settings (see the module's docstring)."""
    settings = {"repetition_penalty": values.get("repetition_penalty")}
    if values.get("do_sample") is True:
        settings.update(temperature=values.get("temperature", 1.0), top_p=values.get("top_p", 1.0),
                        top_k=values.get("top_k", HF_TOP_K))
    ignored = tuple(key for key in HF_UNSUPPORTED if values.get(key) is not None)
    return _checked(settings, where, ignored)


def from_gguf(metadata: dict, name: str) -> GenerationDefaults:
    """llama.cpp's sampling keys of a GGUF file's metadata."""
    settings = {setting: metadata.get(key) for key, setting in GGUF_KEYS.items()}
    ignored = tuple(key.rsplit(".", 1)[1] for key in GGUF_UNSUPPORTED if metadata.get(key) is not None)
    return _checked(settings, f"{name}: general.sampling", ignored)


def _checked(settings: dict, where: str, ignored: tuple[str, ...]) -> GenerationDefaults:
    """The settings as a GenerationDefaults, each checked by the rule ``generate`` applies to it (sampling.py,
    penalties.py), else a LlaisysValueError naming ``where`` and the setting."""
    from ..engine.penalties import check_repetition_penalty
    from ..engine.sampling import check_sampling

    given = {name: value for name, value in settings.items() if value is not None}
    for name, value in given.items():
        try:
            if name == "repetition_penalty":
                check_repetition_penalty(value)
            else:  # (the others at values that pass, so that the message is this setting's)
                check_sampling(**{"top_k": 0, "top_p": 1.0, "temperature": 1.0, "seed": None, name: value})
        except LlaisysValueError as e:
            raise LlaisysValueError(f"{where}: {name} = {value!r} is not a valid setting ({e}); fix the file, or "
                                    f"turn the model's defaults off (--generation-config none)") from None
    def number(name: str) -> float | None:
        return None if name not in given else float(given[name])

    top_k = None if "top_k" not in given else int(given["top_k"])
    return GenerationDefaults(temperature=number("temperature"), top_k=top_k, top_p=number("top_p"),
                              repetition_penalty=number("repetition_penalty"), source=where.rsplit("/", 1)[-1],
                              ignored=ignored)
