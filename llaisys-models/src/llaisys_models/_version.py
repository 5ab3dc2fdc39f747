"""The version of llaisys-models, written only here: its pyproject.toml reads it (without importing the
package) and ``llaisys_models.__version__`` is this."""

__version__ = "0.2.0"
