"""Session fixtures of the model tests: tiny checkpoints are made once per session."""

import pytest
import torch

from tiny_models import TinyModels


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> TinyModels:
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    return TinyModels(tmp_path_factory.mktemp("tiny_models"))
