"""A Ray cluster of two nodes on 127.0.0.1, one CPU each, for the tests that need one (tests/serve/test_replicas*.py).

One cluster serves every such test of a run: the ``ray_cluster`` fixture (conftest.py) hands out ``SHARED``,
whose ``start()`` starts it on first use and connects this process to it; conftest stops it after the last test
of a run of tests that use it, so the rest of the session does not carry its processes. Small object stores, no
dashboard, no autoscaler (a fixed cluster), no usage reports, every port on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path

LOOPBACK = "127.0.0.1"
RAY_ENVIRON = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # a node on 127.0.0.1 stays there (else Ray takes the outward address)
    "RAY_USAGE_STATS_ENABLED": "0",  # no report to Ray's servers
}


@contextlib.contextmanager
def environ(values: dict):
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class SharedCluster:
    def __init__(self):
        self.cluster = None
        self.temp_dir: str | None = None

    def start(self):
        """The cluster (``ray.cluster_utils.Cluster``), this process connected to it as a driver."""
        if self.cluster is None:
            # Ray's sockets live under its temp dir and AF_UNIX paths stop at 107 bytes: nox's TMPDIR (deep in
            # the checkout) is too long for them, so the cluster gets a short one, set while it runs.
            self.temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
            os.environ["RAY_TMPDIR"] = self.temp_dir
            with environ(RAY_ENVIRON):  # read by the Ray processes this starts
                import ray
                from ray.cluster_utils import Cluster

                node = {"num_cpus": 1, "object_store_memory": 80 << 20, "node_ip_address": LOOPBACK}
                cluster = Cluster(initialize_head=True, head_node_args={
                    **node, "include_dashboard": False, "no_monitor": True,
                    "_system_config": {"metrics_report_interval_ms": 500}})
                try:
                    cluster.add_node(**node)
                    ray.init(address=cluster.address, logging_level="WARNING")
                    cluster.wait_for_nodes()
                except BaseException:
                    cluster.shutdown()
                    self._remove_temp_dir()
                    raise
                self.cluster = cluster
        return self.cluster

    def stop(self) -> None:
        if self.cluster is not None:
            import ray

            cluster, self.cluster = self.cluster, None
            ray.shutdown()
            cluster.shutdown()
            self._remove_temp_dir()

    def _remove_temp_dir(self) -> None:
        os.environ.pop("RAY_TMPDIR", None)
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None


SHARED = SharedCluster()


def processes_titled(cluster, title: bytes) -> list[int]:
    """The process ids of the Ray workers of ``cluster`` (the children of its nodes' raylets) whose title begins
    with ``title`` (b"ray::<actor class>")."""
    raylets = {info.process.pid for node in cluster.list_all_nodes() for info in node.all_processes["raylet"]}
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError, TypeError):
            parent = int(re.search(r"^PPid:\s*(\d+)", status.read_text(), re.M)[1])
            if parent in raylets and (status.parent / "cmdline").read_bytes().startswith(title):
                found.append(int(status.parent.name))
    return found
