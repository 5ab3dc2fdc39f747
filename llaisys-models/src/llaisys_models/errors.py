"""Errors raised while reading a model directory or running a model."""

from llaisys import LlaisysError, LlaisysValueError


class ModelLoadError(LlaisysValueError):
    """A model directory that cannot be loaded: missing or corrupt files, wrong shapes, unknown kind.

    Raised before the model object exists, so nothing is ever half-loaded.
    """


class ModelBusyError(LlaisysError, RuntimeError):
    """The calling thread already runs this model (an unfinished ``stream_generate``)."""


class RankFailedError(LlaisysError, RuntimeError):
    """A rank of a tensor-parallel group died, hung or failed: the group is closed (its message names the rank)."""


def shown(value: object) -> str:
    """repr() of a value read from a file, cut short: a hostile file must not make a megabyte message."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
