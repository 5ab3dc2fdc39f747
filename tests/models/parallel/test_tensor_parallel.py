"""Tensor parallelism on the CPU: a model split over 2 ranks (this process and one it starts) decodes as the
model on one rank does.

In f32 the greedy tokens are the same (the split only changes where partial sums are added: a few ulps);
in bf16, and for int8 weights, where a step's partial sums are rounded before they are added, a different
choice is accepted only at a near-tie of the one-rank model's own logits (test_parity's tolerances),
teacher-forced. generate, generate_batch, decode graphs, the paged KV cache (each rank holds its kv heads),
int8 and int4 (shard, then quantize), GGUF files, the server, user-launched ranks (RANK / WORLD_SIZE / MASTER_*),
and a rank that dies or hangs: the group ends with one line naming it, well within 30 s,
and no process stays behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import llaisys
import llaisys_models
from helpers.parity_rule import MAX_NEAR_TIE_RATE, tie_tolerance
from helpers.tiny_models import SPECS, prompt
from llaisys_models.cli.parity import teacher_forced_logits
from llaisys_models.errors import RankFailedError
from llaisys_models.loading.quantize import BlockWeight, Int8Weight

# GQA split; 1 kv head replicated + tied embeddings; bf16 MHA; Phi-3's fused qkv / gate_up (parts of parts)
NAMES = ["f32_gqa2_hd32", "llama_f32_tied", "bf16_mha_hd64", "phi3_f32"]
LENGTHS = (1, 13, 64)
NEW = 20


@pytest.fixture(scope="module")
def split(tiny_models):
    """name -> the model split over 2 ranks (CPU); loaded at once (each mostly waits for its other rank)."""
    paths = {name: tiny_models.path(name) for name in NAMES}
    with ThreadPoolExecutor(len(NAMES)) as pool:
        loads = {name: pool.submit(llaisys_models.load, path, device="cpu", tensor_parallel=2)
                 for name, path in paths.items()}
    models = {name: load.result() for name, load in loads.items()}
    yield models
    for model in models.values():
        model.close()


def one_rank(loaded_models, name):
    return loaded_models("cpu", [name])[name]


def near_ties(reference, model, ids: list[int], dtype: str) -> int:
    """``model`` (teacher-forced on ``reference``'s greedy tokens) picks the same token at every step, or one
    whose logit in ``reference``'s own logits is within the near-tie tolerance of the maximum; how many."""
    tokens = reference.generate(ids, NEW, eos_token_ids=())[len(ids):]
    ours = teacher_forced_logits(model, ids, tokens)
    theirs = teacher_forced_logits(reference, ids, tokens)
    ties = 0
    for step, (mine, row) in enumerate(zip(ours.argmax(axis=1), theirs)):
        if mine != tokens[step]:
            gap = float(row.max() - row[mine])
            assert gap <= tie_tolerance(float(row.max()), dtype), (
                f"step {step}: the split model picks {mine}, one rank {tokens[step]}, {gap:.3g} below its max")
            ties += 1
    return ties


def assert_rare_near_ties(reference, model, name: str, dtype: str) -> None:
    ties = [near_ties(reference, model, prompt(name, length, SPECS[name].vocab), dtype) for length in LENGTHS]
    assert sum(ties) <= max(1, MAX_NEAR_TIE_RATE[dtype] * NEW * len(LENGTHS)), f"near-ties by prompt: {ties}"


def test_each_rank_holds_its_part(split, loaded_models):
    model = split["llama_f32_tied"]  # 4 q heads, 1 kv head (replicated), tied embeddings, vocab 320
    spec, layer = SPECS["llama_f32_tied"], model.weights.layers[0]
    d = spec.hidden // spec.heads
    assert (model.config.num_attention_heads, model.config.num_key_value_heads) == (2, 1)
    assert layer.q_proj.shape == (2 * d, spec.hidden) and layer.k_proj.shape == (d, spec.hidden)
    assert layer.o_proj.shape == (spec.hidden, 2 * d) and layer.down_proj.shape == (spec.hidden, spec.inter // 2)
    assert model.weights.lm_head.shape == (spec.vocab // 2, spec.hidden)
    assert model.weights.embed_tokens.shape[0] == spec.vocab
    assert model.new_kv_pool(4).keys[0].shape[2] == 1  # this rank's kv heads only
    assert model.group.world_size == 2 and "tensor_parallel=2" in repr(model)
    whole = one_rank(loaded_models, "llama_f32_tied")
    np.testing.assert_array_equal(layer.q_proj.numpy(), whole.weights.layers[0].q_proj.numpy()[:2 * d])
    np.testing.assert_array_equal(layer.o_proj.numpy(), whole.weights.layers[0].o_proj.numpy()[:, :2 * d])


@pytest.mark.parametrize("name", [n for n in NAMES if SPECS[n].dtype == "f32"])
def test_f32_greedy_tokens_are_one_rank_s(split, loaded_models, name):
    model, whole = split[name], one_rank(loaded_models, name)
    replays = model._decode_graphs.replays
    for length in LENGTHS:
        ids = prompt(name, length, SPECS[name].vocab)
        assert model.generate(ids, NEW, eos_token_ids=()) == whole.generate(ids, NEW, eos_token_ids=()), length
    assert model._decode_graphs.replays > replays, "the split model's decode steps ran from graphs"
    prompts = [prompt(name, length, SPECS[name].vocab) for length in LENGTHS]
    assert model.generate_batch(prompts, NEW, eos_token_ids=()) == whole.generate_batch(prompts, NEW, eos_token_ids=())
    long = prompt(name, 400, SPECS[name].vocab)  # a step whose message takes two broadcasts (messages.FIRST)
    np.testing.assert_allclose(model.logits(long), whole.logits(long), rtol=0, atol=1e-4)


def test_bf16_within_near_ties(split, loaded_models):
    assert_rare_near_ties(one_rank(loaded_models, "bf16_mha_hd64"), split["bf16_mha_hd64"], "bf16_mha_hd64", "bf16")


def test_a_quantized_kv_cache_is_quantized_on_every_rank(split, tiny_models):
    """kv_cache_dtype="int8" on a split model: each rank stores its kv heads in int8 (rank 0's pool command says
    so), so the tokens are the one-rank int8-cache model's (f32: the split moves values by ulps only)."""
    name = "f32_gqa2_hd32"
    model = split[name]
    one = llaisys_models.load(tiny_models.path(name), device="cpu", kv_cache_dtype="int8")
    plain = llaisys_models.load(tiny_models.path(name), device="cpu")
    model.kv_cache_dtype = "int8"
    try:
        for length in LENGTHS:
            ids = prompt(name, length, SPECS[name].vocab)
            assert model.generate(ids, NEW, eos_token_ids=()) == one.generate(ids, NEW, eos_token_ids=())
        ids = prompt(name, 64, SPECS[name].vocab)
        got, want, unquantized = model.logits(ids), one.logits(ids), plain.logits(ids)
        # (the other rank's heads too: an f32 cache there would leave half the int8 error)
        assert np.abs(got - want).max() < 0.05 * np.abs(unquantized - want).max()
    finally:
        model.kv_cache_dtype = "auto"


def test_layer_groups_on_every_rank(tiny_models, loaded_models):
    """Gemma 3's sliding layers beside a global one: every rank's pool has the same layer groups, and each step
    carries each group's slots and tables (kv_cache.layer_groups), so the split model's f32 tokens are the one
    rank's, past the window (24) too."""
    name = "gemma3_f32"
    model = llaisys_models.load(tiny_models.path(name), device="cpu", tensor_parallel=2)
    try:
        whole = one_rank(loaded_models, name)
        assert len(model.kv_layer_groups) == 3
        for length in (13, 64):
            ids = prompt(name, length, SPECS[name].vocab)
            assert model.generate(ids, NEW, eos_token_ids=()) == whole.generate(ids, NEW, eos_token_ids=()), length
        prompts = [prompt(name, length, SPECS[name].vocab) for length in LENGTHS]
        assert model.generate_batch(prompts, NEW, eos_token_ids=()) == \
            whole.generate_batch(prompts, NEW, eos_token_ids=())
    finally:
        model.close()


def test_int8_weights_are_split_then_quantized(tiny_models, loaded_models):
    """Each rank quantizes its own part (blocks of 16 rows, groups of 32 inputs): where the parts start on a
    block and a group, they are the one-rank model's int8 values to the bit. The logits then carry int8's
    usual error (test_int8's bounds), not more: activations are quantized on the fly, so the split's few-ulp
    differences can move a value across a rounding step, and the two int8 models differ by that."""
    from helpers.int8_quality import MAX_RELATIVE_ERROR, MEAN_RELATIVE_ERROR, MIN_ARGMAX_AGREEMENT, relative_errors

    name = "f32_gqa2_hd32"
    model = llaisys_models.load(tiny_models.path(name), device="cpu", quantize="int8", tensor_parallel=2)
    try:
        whole = llaisys_models.load(tiny_models.path(name), device="cpu", quantize="int8")
        mine, all_of = model.weights.layers[1], whole.weights.layers[1]
        assert isinstance(mine.o_proj, Int8Weight) and mine.o_proj.shape == (128, 64)
        assert isinstance(model.weights.lm_head, Int8Weight) and model.weights.lm_head.shape == (192, 128)
        for field, blocks, groups in (("q_proj", slice(0, 4), slice(None)), ("o_proj", slice(None), slice(0, 2))):
            part, full = getattr(mine, field), getattr(all_of, field)
            np.testing.assert_array_equal(part.weight.numpy(), full.weight.numpy()[blocks, groups], err_msg=field)
            np.testing.assert_array_equal(part.scales.numpy(), full.scales.numpy()[blocks, groups], err_msg=field)
        floats = one_rank(loaded_models, name)
        for length in LENGTHS:
            ids = prompt(name, length, SPECS[name].vocab)
            tokens = floats.generate(ids, NEW, eos_token_ids=())[length:]
            want = teacher_forced_logits(floats, ids, tokens)
            split_int8, whole_int8 = teacher_forced_logits(model, ids, tokens), teacher_forced_logits(whole, ids, tokens)
            errors = relative_errors(split_int8, want)
            assert errors.max() <= MAX_RELATIVE_ERROR and errors.mean() <= MEAN_RELATIVE_ERROR, errors
            agreement = (split_int8.argmax(axis=1) == whole_int8.argmax(axis=1)).mean()
            assert agreement >= MIN_ARGMAX_AGREEMENT, agreement
    finally:
        model.close()


def test_int4_weights_are_split_then_quantized(tiny_models):
    """int4 as int8 above: each rank quantizes its own part, in q4_0 (its lm_head rows in q8_0). The split model
    picks the one-rank int4 model's tokens, teacher-forced, as often as int8's bound asks (activations are
    quantized on the fly, so the split's few-ulp differences can move a value across a rounding step)."""
    from helpers.int8_quality import MIN_ARGMAX_AGREEMENT

    name = "f32_gqa2_hd32"
    model = llaisys_models.load(tiny_models.path(name), device="cpu", quantize="int4", tensor_parallel=2)
    try:
        whole = llaisys_models.load(tiny_models.path(name), device="cpu", quantize="int4")
        mine = model.weights.layers[1]
        assert isinstance(mine.o_proj, BlockWeight) and (mine.o_proj.fmt, mine.o_proj.shape) == ("q4_0", (128, 64))
        lm_head = model.weights.lm_head
        assert isinstance(lm_head, BlockWeight) and (lm_head.fmt, lm_head.shape) == ("q8_0", (192, 128))
        ids = prompt(name, 13, SPECS[name].vocab)
        tokens = whole.generate(ids, NEW, eos_token_ids=())[len(ids):]
        split_int4 = teacher_forced_logits(model, ids, tokens)
        agreement = (split_int4.argmax(axis=1) == np.asarray(tokens)).mean()
        assert agreement >= MIN_ARGMAX_AGREEMENT, agreement
    finally:
        model.close()


def test_gguf_file_split(tiny_models, tmp_path):
    """Each rank keeps its part of every matrix in the file's Q8_0 blocks where the part cuts no block (rows always;
    here columns too: o_proj's 64 and down_proj's 128 of 32-value blocks): q_proj's rows in HF order from Llama's
    permuted ones, the replicated kv head, the tied lm_head's vocabulary rows. The tokens are the file's on one
    rank, and a part is byte for byte those rows of the one-rank model's blocks."""
    from gguf import GGMLQuantizationType

    from helpers.gguf_files import write_gguf

    name = "llama_f32_tied"  # Llama's permuted q/k rows, a tied lm_head, 1 kv head (replicated)
    path = write_gguf(tiny_models.hf(name), tiny_models.path(name), tmp_path / "tiny.gguf", GGMLQuantizationType.Q8_0)
    model = llaisys_models.load(path, device="cpu", tensor_parallel=2)
    try:
        whole = llaisys_models.load(path, device="cpu")
        mine, all_of = model.weights.layers[0], whole.weights.layers[0]
        for field, shape in (("q_proj", (64, 128)), ("k_proj", (32, 128)), ("o_proj", (128, 64)),
                             ("gate_proj", (128, 128)), ("down_proj", (128, 128))):
            weight = getattr(mine, field)
            assert isinstance(weight, BlockWeight) and (weight.fmt, weight.shape) == ("q8_0", shape), field
        assert isinstance(model.weights.lm_head, BlockWeight) and model.weights.lm_head.shape == (160, 128)
        np.testing.assert_array_equal(mine.q_proj.weight.numpy(), all_of.q_proj.weight.numpy()[:4])  # (16-row blocks)
        np.testing.assert_array_equal(mine.q_proj.scales.numpy(), all_of.q_proj.scales.numpy()[:4])
        for length in (13, 64):
            ids = prompt(name, length, 320)
            assert model.generate(ids, NEW, eos_token_ids=()) == whole.generate(ids, NEW, eos_token_ids=())
    finally:
        model.close()


def test_served(split, loaded_models, tiny_models):
    from helpers.serve_helpers import chat_ids, http_request, require_serving

    require_serving()
    from llaisys_models.serve.background import BackgroundServer
    from llaisys_models.serve.engine import Engine
    from llaisys_models.serve.server import Server
    from llaisys_models.text.tokenizer import load_tokenizer

    name = "f32_gqa2_hd32"
    tokenizer = load_tokenizer(tiny_models.path(name))
    engine = Engine(split[name], tokenizer, max_running=4, kv_memory=4 << 20)
    messages = [{"role": "user", "content": "tensor parallel"}]
    with BackgroundServer(Server(engine, load_tokenizer(tiny_models.path(name)), "tiny")) as server:
        reply = http_request(server.base_url, "POST", "/v1/chat/completions", {
            "model": "tiny", "messages": messages, "max_tokens": 12, "temperature": 0}, timeout=60)
    assert reply.status == 200, reply.text
    ids = chat_ids(tokenizer, messages)
    want = one_rank(loaded_models, name).generate(ids, 12)[len(ids):]
    assert reply.json()["choices"][0]["message"]["content"] == tokenizer.decode(want)


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_dead_or_hung_rank_ends_the_group(tiny_models, monkeypatch, how):
    monkeypatch.setenv("LLAISYS_DIST_TIMEOUT", "2")  # (rank 0's and the started rank's)
    model = llaisys_models.load(tiny_models.path("f32_gqa2_hd32"), device="cpu", tensor_parallel=2)
    process = model.followers.ranks.launcher.processes[1]
    ids = prompt("f32_gqa2_hd32", 13, 384)
    model.generate(ids, 4)
    os.kill(process.pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
    start = time.monotonic()
    with pytest.raises(RankFailedError, match="rank 1") as failed:
        model.generate(ids, NEW)
    seconds = time.monotonic() - start
    assert seconds < 30, f"the group ended after {seconds:.1f} s"
    message = str(failed.value)
    assert "\n" not in message and ("SIGKILL" in message if how == "killed" else "is late" in message), message
    assert process.poll() is not None, "the rank's process is left running"
    with pytest.raises(RankFailedError, match="rank 1"):
        model.generate(ids, 2)
    model.close()


def test_user_launched_ranks(tiny_models, loaded_models):
    """Two processes told their ranks by RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (as torchrun does) and
    each calling load(..., tensor_parallel=2): rank 0 generates, rank 1 follows, both exit 0."""
    name = "f32_gqa2_hd32"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ids = prompt(name, 13, SPECS[name].vocab)
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "PYTHONPATH": os.path.dirname(__file__), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "tp_ranks", str(tiny_models.path(name)), json.dumps(ids), str(NEW)]
    ranks = [subprocess.Popen(command, env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for rank in range(2)]
    outputs = [rank.communicate(timeout=120) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], [err[-1500:] for _, err in outputs]
    assert json.loads(outputs[0][0]) == one_rank(loaded_models, name).generate(ids, NEW, eos_token_ids=())
    assert outputs[1][0] == ""


def test_one_rank_through_a_communicator(tiny_models, loaded_models):
    """A group of one (what a machine with one GPU can run): every collective through the communicator."""
    from llaisys_models.parallel.launch import load_parallel

    name = "llama_f32_tied"
    model = load_parallel(tiny_models.path(name), 1, device="cpu")
    try:
        assert type(model.group) is llaisys.distributed.Group and model.group.world_size == 1
        ids = prompt(name, 13, SPECS[name].vocab)
        assert model.generate(ids, NEW, eos_token_ids=()) == one_rank(loaded_models, name).generate(ids, NEW,
                                                                                                   eos_token_ids=())
    finally:
        model.close()


def test_accelerator_ranks(tiny_models, device):
    """On an accelerator (tools/gpu_check.sh runs tests/models with --backend=cuda): f32 greedy tokens of the
    model split over every device of its kind (cuda:0 .. cuda:N-1), or on one device through a communicator of
    one (NCCL's collectives all the same), against the model on device 0 alone."""
    if device.type == "cpu":
        pytest.skip("the CPU's ranks are the tests above")
    if device.index != 0:
        pytest.skip(f"a group starts at {device.type}:0")
    from llaisys_models.parallel.launch import load_parallel

    name, ranks = "f32_gqa2_hd32", len([d for d in llaisys.available_devices() if d.type == device.type])
    try:
        model = load_parallel(tiny_models.path(name), min(ranks, 2), device=str(device))
    except llaisys.NotSupportedError as e:
        pytest.skip(f"{device.type} has no collectives here: {e}")
    try:
        whole = llaisys_models.load(tiny_models.path(name), device=str(device))
        for length in LENGTHS:
            ids = prompt(name, length, SPECS[name].vocab)
            assert model.generate(ids, NEW, eos_token_ids=()) == whole.generate(ids, NEW, eos_token_ids=()), length
    finally:
        model.close()


def test_cli_splits_the_cores(monkeypatch):
    from llaisys_models.cli.generate import split_cpu_threads

    monkeypatch.setenv("OMP_NUM_THREADS", "0")  # (so that the environment is restored after the test)
    monkeypatch.delenv("OMP_NUM_THREADS")
    split_cpu_threads(2)
    assert os.environ["OMP_NUM_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) // 2))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    split_cpu_threads(2)
    assert os.environ["OMP_NUM_THREADS"] == "3"  # the user's choice stays


def test_vocabulary_rows_padded_and_gathered():
    """A vocabulary that does not divide evenly (7 ids over 2 ranks: 4 + 3, the last padded with a zero row):
    each rank's rows, and the logits put back together in id order without the padding."""
    from llaisys_models.families.config import ModelConfig
    from llaisys_models.parallel.layout import Layout
    from llaisys_models.parallel.shards import part_reader
    from llaisys_models.parallel.vocab import gather_vocab

    config = ModelConfig.from_dict({"hidden_size": 4, "num_attention_heads": 2, "num_hidden_layers": 1,
                                    "intermediate_size": 8, "vocab_size": 7})
    table = np.arange(7 * 3, dtype=np.float32).reshape(7, 3)
    parts = [Layout(rank, 2).part("lm_head", config) for rank in range(2)]
    rows = [part_reader(lambda a, b: table[a:b], table.shape, part) for part in parts]
    assert [shape for _, shape in rows] == [(4, 3), (4, 3)]
    np.testing.assert_array_equal(rows[0][0](0, 4), table[:4])
    np.testing.assert_array_equal(rows[1][0](0, 4), np.concatenate([table[4:], np.zeros((1, 3), np.float32)]))

    class TwoRanks:  # rank 0's view of an all_gather: its own logits and rank 1's
        world_size = 2

        def all_gather(self, out, t):
            out.load(np.stack([t.numpy(), t.numpy() + 100]))

    local = llaisys.from_numpy(np.arange(2 * 4, dtype=np.float32).reshape(2, 4))  # 2 rows, 4 ids each
    logits = gather_vocab(local, 7, TwoRanks()).numpy()
    want = np.concatenate([local.numpy(), local.numpy() + 100], axis=1)[:, :7]
    np.testing.assert_array_equal(logits, want)


def test_cpu_ranks_on_another_host_are_refused():
    """Ranks on the CPU meet in one host's shared memory: two Ray nodes of one host may hold them, two hosts may
    not (the placement check of ray_ranks.py, on the places its actors report)."""
    from llaisys_models.parallel.hosts import Place, check_one_host, host_key

    here = host_key()
    assert here == host_key() and "/shm:" in here  # (Linux: boot id, /dev/shm, pid namespace)
    two_raylets = {0: Place("a" * 56, "127.0.0.1", here, 10), 1: Place("b" * 56, "127.0.0.1", here, 11)}
    check_one_host(two_raylets)
    two_hosts = {**two_raylets, 2: Place("c" * 56, "10.0.0.7", "another-boot/shm:30/pid:1", 12)}
    with pytest.raises(llaisys.LlaisysError, match=r"rank 2 was placed on Ray node cccccccc \(10\.0\.0\.7\), another "
                                                   r"host than rank 0's \(aaaaaaaa, 127\.0\.0\.1\)") as refused:
        check_one_host(two_hosts)
    assert "\n" not in str(refused.value) and "GPUs" in str(refused.value)


def test_distributed_executor_values(tiny_models):
    path = tiny_models.path("f32_gqa2_hd32")
    with pytest.raises(llaisys_models.ModelLoadError, match="distributed_executor must be one of 'local', 'ray'"):
        llaisys_models.load(path, device="cpu", tensor_parallel=2, distributed_executor="mpi")
    with pytest.raises(llaisys_models.ModelLoadError, match="give tensor_parallel=N"):
        llaisys_models.load(path, device="cpu", distributed_executor="ray")


def test_a_model_that_does_not_split_is_refused(tiny_models):
    path = tiny_models.path("f32_gqa2_hd32")  # 4 heads, 2 kv heads
    with pytest.raises(llaisys_models.ModelLoadError, match="cannot be split over 3 ranks: num_attention_heads = 4"):
        llaisys_models.load(path, device="cpu", tensor_parallel=3)
    for bad in (0, True, "2"):
        with pytest.raises(llaisys_models.ModelLoadError, match="tensor_parallel must be"):
            llaisys_models.load(path, device="cpu", tensor_parallel=bad)
    assert llaisys.distributed.local_group("cpu").world_size == 1
