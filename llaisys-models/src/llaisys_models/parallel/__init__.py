"""Tensor parallelism: one model split over several devices (ranks), Megatron-style.

    model = llaisys_models.load(path, tensor_parallel=2)     # this process is rank 0; rank 1 is started
    model.generate(ids, max_new_tokens=32)                   # the engine runs here; rank 1 follows
    model.close()                                            # (or at exit)

layout.py      which part of each weight a rank holds; the rank's own config (heads, MLP width)
shards.py      reading a part from the mapped checkpoint (safetensors, GGUF; float or int8)
vocab.py       the logits gathered from the ranks' rows of the vocabulary
messages.py    what rank 0 sends the others before each step, through the group's broadcast
followers.py   rank 0's side: sending steps and KV pool changes, watching the ranks, ending the group
worker.py      the other ranks' side: load, then follow
launcher.py    RankSpec and RankLauncher: starting ranks (processes of this host; Ray actors later)
store.py       rank 0's control store: hello, unique id, ready, errors, liveness (no per-step data)
launch.py      load(..., tensor_parallel=N) on rank 0, and for ranks the user starts (RANK, WORLD_SIZE, ...)
options.py     what every rank loads
"""
