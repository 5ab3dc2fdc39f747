"""The replicas application for Ray's own ``serve run`` (or a Serve config file's ``import_path``):

    serve run llaisys_models.serve.ray_app:build_app model=PATH replicas=2 max-running=8

Each ``key=value`` is the ``llaisys serve`` option ``--key value`` (``key=true`` for a flag); ``replicas``
defaults to 1. Ray Serve's HTTP proxy listens where ``serve run`` (or the config) says; ``host`` and ``port``
must name that address (defaults: 127.0.0.1 and 8000, Ray Serve's own), as replicas answer requests for it only
when it is a loopback address (the single server's ``Host`` check).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray.serve import Application


def build_app(args: dict[str, object]) -> Application:
    """The application (``serve/replicas/deployments.py``) of the ``llaisys serve`` options in ``args``."""
    from .cli import checked_options, register_serve
    from .replicas.launch import replica_application

    parser = argparse.ArgumentParser(prog="serve run llaisys_models.serve.ray_app:build_app")
    register_serve(parser.add_subparsers())
    argv = ["serve"]
    for key, value in {"replicas": "1", **args}.items():
        flag = "--" + str(key).replace("_", "-")
        if str(value).lower() == "true":
            argv.append(flag)
        elif str(value).lower() != "false":
            argv += [flag, str(value)]
    options = parser.parse_args(argv)
    path, kv_memory, keys = checked_options(options)
    return replica_application(options, path, kv_memory, keys, options.port)
