"""Errors raised while reading a model directory or running a model."""

from llaisys import LlaisysValueError


class ModelLoadError(LlaisysValueError):
    """A model directory that cannot be loaded: missing or corrupt files, wrong shapes, unknown kind.

    Raised before the model object exists, so nothing is ever half-loaded.
    """
