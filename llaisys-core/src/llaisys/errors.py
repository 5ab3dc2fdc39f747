"""Exceptions raised by llaisys."""


class LlaisysError(Exception):
    """Any failure reported by llaisys: a backend, a kernel or the runtime."""


class LlaisysValueError(LlaisysError, ValueError):
    """A bad argument: wrong dtype, shape, device, view or index."""


class BackendUnavailableError(LlaisysError, RuntimeError):
    """A device was asked for whose backend is missing, broken or has no device."""


class ApiVersionError(BackendUnavailableError):
    """A backend library built for another major version of the backend ABI (llaisys/backend.h)."""

    def __init__(self, message: str, version: int):
        super().__init__(message)
        self.version = version  # the library's api_version()


class OutOfMemoryError(LlaisysError, MemoryError):
    """A device allocation failed; the message says how many bytes were asked for."""


class NotSupportedError(LlaisysError):
    """A backend does not implement an optional capability (events, graphs, peer copy, ...), or an op that
    cannot fall back to the CPU backend (LLAISYS_FALLBACK=0, or no CPU backend)."""


class LlaisysWarning(UserWarning):
    """Something llaisys works around but the user should fix (e.g. an unknown name in LLAISYS_BACKENDS)."""
