"""Exceptions raised by llaisys."""


class LlaisysError(Exception):
    """Any failure reported by llaisys: a backend, a kernel or the runtime."""


class LlaisysValueError(LlaisysError, ValueError):
    """A bad argument: wrong dtype, shape, device, view or index."""


class BackendUnavailableError(LlaisysError, RuntimeError):
    """A device was asked for whose backend is missing, broken or has no device."""


class OutOfMemoryError(LlaisysError, MemoryError):
    """A device allocation failed; the message says how many bytes were asked for."""


class NotSupportedError(LlaisysError):
    """A backend does not implement an optional capability (events, graphs, peer copy, ...)."""


class LlaisysWarning(UserWarning):
    """Something llaisys works around but the user should fix (e.g. an unknown name in LLAISYS_BACKENDS)."""
