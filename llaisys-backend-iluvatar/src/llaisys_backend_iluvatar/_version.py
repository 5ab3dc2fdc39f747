"""The version of llaisys-backend-iluvatar, written only here: its pyproject.toml reads it (without importing the
package) and ``llaisys_backend_iluvatar.__version__`` is this."""

__version__ = "0.2.0"
