"""Loads a library that is not there, like a backend package whose build output went missing."""

from pathlib import Path

import llaisys


def _load():
    return llaisys.NativeBackend("broken", Path(__file__).with_name("libllaisys_broken.so"), prefix="llaisys_broken")


@llaisys.hookimpl
def llaisys_backends():
    return [llaisys.BackendSpec(name="broken", load=_load)]
