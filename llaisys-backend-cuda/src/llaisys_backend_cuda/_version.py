"""The version of llaisys-backend-cuda, written only here: its pyproject.toml reads it (without importing the
package) and ``llaisys_backend_cuda.__version__`` is this."""

__version__ = "0.2.0"
