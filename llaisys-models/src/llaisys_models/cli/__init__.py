"""The ``llaisys`` subcommands this package adds: ``generate`` and ``infer``."""
