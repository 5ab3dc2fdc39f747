"""Session fixtures of the model tests: tiny checkpoints are made once per session."""

import pytest
import torch

from helpers import skip_without_kernels
from helpers.tiny_models import TinyModels
from llaisys_models.families.family import KERNELS


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> TinyModels:
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    return TinyModels(tmp_path_factory.mktemp("tiny_models"))


@pytest.fixture(scope="session")
def loaded_models(tiny_models):
    """``loaded_models(device, names)``: the test models on ``device``, each loaded once per session."""
    import llaisys_models

    cache: dict = {}

    def load(device, names) -> dict:
        for name in names:
            if (device, name) not in cache:
                cache[device, name] = llaisys_models.load(tiny_models.path(name), device=device)
        return {name: cache[device, name] for name in names}
    return load


@pytest.fixture(autouse=True)
def _device_runs_the_models(request):
    """A model test on a device whose backend cannot run the models (no paged KV kernels) is skipped."""
    if "device" in request.fixturenames:
        skip_without_kernels(request.getfixturevalue("device"), KERNELS, "the models' paged KV cache")
