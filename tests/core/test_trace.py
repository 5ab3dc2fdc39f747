"""llaisys.profile(trace=...): each op call inside the block is one Chrome trace event, written to the file when
the block ends (atomically, capped, from every thread); without a trace nothing is written."""

import json
import threading

import numpy as np
import pytest

import llaisys
from llaisys import ops, trace
from llaisys.distributed import Group
from llaisys.plugins import registry


def _vectors(n=64):
    a = llaisys.from_numpy(np.arange(n, dtype=np.float32))
    return a, llaisys.empty((n,))


def _tensors(m=2, n=8, k=16):
    rng = np.random.default_rng(0)
    x = llaisys.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
    w = llaisys.from_numpy(rng.standard_normal((n, k)).astype(np.float32))
    return x, w, llaisys.empty((m, n))


def _calls(path):
    """The file's op events (ph X), after checking its shape."""
    data = json.loads(path.read_text())
    assert data["displayTimeUnit"] == "ms"
    return [e for e in data["traceEvents"] if e["ph"] == "X"], data


def test_each_op_call_is_one_complete_event(tmp_path):
    a, out = _vectors()
    x, w, y = _tensors()
    path = tmp_path / "t.json"
    with llaisys.profile(trace=path) as prof:
        for _ in range(3):
            ops.add(out, a, a)
        ops.linear(y, x, w)
        with prof.label("head"):
            ops.linear(y, x, w)
    events, data = _calls(path)
    assert [e["name"] for e in events] == ["add", "add", "add", "linear", "head"]
    assert events == prof.trace_events
    for e in events:
        assert e["cat"] == "op" and e["pid"] > 0 and isinstance(e["tid"], int)
        assert e["ts"] >= 0 and e["dur"] >= 0 and e["args"]["device"] == "cpu:0"
    assert events[0]["args"]["sizes"] == [64]
    assert events[3]["args"]["sizes"] == [2, 8, 16]  # M x N x K, as shapes=True groups linear
    assert events[4]["args"] == {"device": "cpu:0", "sizes": [2, 8, 16], "op": "linear"}
    starts = [e["ts"] for e in events]
    assert starts == sorted(starts)
    for before, after in zip(events, events[1:]):  # one thread: each call ends before the next starts
        assert before["ts"] + before["dur"] <= after["ts"] + 1e-3
    assert dict(prof.calls) == {"add": 3, "linear": 1, "head": 1}  # the sums as without a trace
    names = [e for e in data["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"]
    assert [e["tid"] for e in names] == [events[0]["tid"]]
    assert "otherData" not in data
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]  # no temporary file left


def test_calls_from_two_threads_get_their_own_tids(tmp_path):
    a, out = _vectors()
    b, out2 = _vectors()
    path = tmp_path / "t.json"
    with llaisys.profile(trace=str(path)):
        ops.add(out, a, a)
        worker = threading.Thread(target=lambda: [ops.add(out2, b, b) for _ in range(2)], name="worker")
        worker.start()
        worker.join()
    events, data = _calls(path)
    assert len(events) == 3
    tids = {e["tid"] for e in events}
    assert len(tids) == 2
    named = {e["tid"]: e["args"]["name"] for e in data["traceEvents"] if e["ph"] == "M"}
    assert set(named) == tids and "worker" in named.values()
    for tid in tids:
        starts = [e["ts"] for e in events if e["tid"] == tid]
        assert starts == sorted(starts)


def test_past_the_limit_calls_are_counted_not_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(trace, "TRACE_EVENT_LIMIT", 4)
    a, out = _vectors()
    path = tmp_path / "t.json"
    with llaisys.profile(trace=path) as prof:
        for _ in range(10):
            ops.add(out, a, a)
    events, data = _calls(path)
    assert len(events) == 4 and len(prof.trace_events) == 4
    assert prof.calls["add"] == 10  # the sums still count every call
    assert data["otherData"] == {"dropped_events": 6, "event_limit": 4}
    [note] = [e for e in data["traceEvents"] if e["name"] == "trace truncated"]
    assert note["ph"] == "i" and note["args"]["dropped_events"] == 6
    assert note["ts"] >= events[-1]["ts"]


def test_without_a_trace_nothing_is_written_or_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a, out = _vectors()
    with llaisys.profile() as prof:
        ops.add(out, a, a)
    assert prof.trace_events == [] and prof.calls["add"] == 1
    assert list(tmp_path.iterdir()) == []


def test_a_path_that_cannot_be_written_is_an_error_before_the_block(tmp_path):
    ran = []
    for bad, why in ((tmp_path / "missing" / "t.json", "does not exist"), (tmp_path, "is a directory")):
        with pytest.raises(llaisys.LlaisysValueError, match=why), llaisys.profile(trace=bad):
            ran.append(1)
    assert ran == [] and registry().kernel_wrapper is None
    with pytest.raises(llaisys.LlaisysValueError, match="file path"), llaisys.profile(trace=3):
        pass


def test_a_failing_block_keeps_its_error_and_still_writes(tmp_path):
    a, out = _vectors()
    path = tmp_path / "t.json"
    with pytest.raises(ZeroDivisionError), llaisys.profile(trace=path):
        ops.add(out, a, a)
        raise ZeroDivisionError
    events, _ = _calls(path)
    assert [e["name"] for e in events] == ["add"]
    assert registry().kernel_wrapper is None


def test_a_write_failure_raises_unless_the_block_failed(tmp_path, monkeypatch):
    a, out = _vectors()
    folder = tmp_path / "gone"
    folder.mkdir()
    with pytest.raises(llaisys.LlaisysError, match="cannot write the trace"):
        with llaisys.profile(trace=folder / "t.json"):
            ops.add(out, a, a)
            folder.rmdir()  # the folder vanishes while the block runs
    folder.mkdir()
    with pytest.raises(KeyError) as raised:
        with llaisys.profile(trace=folder / "t.json"):
            folder.rmdir()
            raise KeyError("the block's own")
    assert "the block's own" in str(raised.value)
    if hasattr(raised.value, "add_note"):  # Python 3.11+: the write failure is a note on it
        assert any("cannot write the trace" in note for note in raised.value.__notes__)


class _FakeComm:
    """A backend's collectives that do nothing (one process: the wiring, not the communication, is tested)."""

    def __init__(self):
        self.calls = []

    def comm_all_reduce(self, *args):
        self.calls.append("all_reduce")

    def comm_broadcast(self, *args):
        self.calls.append("broadcast")


def test_collectives_are_events_of_their_own_category(tmp_path):
    group = Group.__new__(Group)  # a member of a communicator, without one to join
    group.device, group.rank, group.world_size, group.timeout = llaisys.Device("cpu", 0), 0, 2, 1.0
    group._backend, group._comm = _FakeComm(), 1
    a, out = _vectors(16)
    path = tmp_path / "t.json"
    with llaisys.profile(trace=path) as prof:
        group.all_reduce(out)
        ops.add(out, a, a)
        group.broadcast(a)
    group._comm = 0  # (nothing to destroy)
    assert group._backend.calls == ["all_reduce", "broadcast"]
    events, _ = _calls(path)
    assert [(e["name"], e["cat"]) for e in events] == [("all_reduce", "collective"), ("add", "op"),
                                                       ("broadcast", "collective")]
    assert events[0]["args"] == {"device": "cpu:0", "sizes": [16]}  # elements summed
    assert events[2]["args"]["sizes"] == [64]  # bytes broadcast
    assert prof.calls["all_reduce"] == 1
    assert Group.__dict__["_call"].__name__ == "_call"  # the plain method is back after the block
