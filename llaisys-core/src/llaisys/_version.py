"""The version of llaisys-core, written only here: its pyproject.toml reads it (without importing the
package) and ``llaisys.__version__`` is this."""

__version__ = "0.2.0"
