"""Exceptions raised by llaisys."""


class LlaisysError(Exception):
    """Any failure reported by llaisys: a backend, a kernel or the runtime."""


class LlaisysValueError(LlaisysError, ValueError):
    """A bad argument: wrong dtype, shape, device, view or index."""


class BackendUnavailableError(LlaisysError, RuntimeError):
    """A device was asked for whose backend is missing, broken or has no device."""
