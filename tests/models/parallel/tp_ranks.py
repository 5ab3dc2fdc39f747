"""A rank of a tensor-parallel group that the user starts (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in its
environment, as torchrun sets them), for tests/models/test_tensor_parallel.py; light on imports.

    python -m tp_ranks MODEL_PATH TOKEN_IDS_JSON NEW_TOKENS

Rank 0 prints its greedy tokens (JSON); the other ranks serve inside ``load`` and leave when rank 0 closes.
"""

import json
import sys

import llaisys_models


def main(path: str, ids: str, new: str) -> None:
    model = llaisys_models.load(path, device="cpu", tensor_parallel=2)  # (rank 1 returns only by SystemExit)
    print(json.dumps(model.generate(json.loads(ids), int(new), eos_token_ids=())))
    model.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
