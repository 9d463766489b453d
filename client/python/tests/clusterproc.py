"""Starts a real cluster for tests, as tests/lib/cluster.sh does: etcd (Debian's `etcd` on PATH)
and three nodes of the real jobbroker binary on loopback ports the OS picks."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

import grpc
from brokerproc import broker_binary

from jobbroker._partition import partition_of_queue
from jobbroker.v1 import admin_pb2, admin_pb2_grpc

NODES = 3


def _free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports free right now, below the kernel's ephemeral range (as the
    C++ harnesses pick theirs, tests/testing/process_util.h). A port that bind(0) handed out is
    released at once, so it can be handed out again (two processes of one cluster were once given
    the same port, and a node exited "cannot listen") or become an outgoing connection's local
    port before the process given it binds."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass  # not Linux: the default range
    hi = min(low, 32768) - 1
    lo = max(1024, hi - 12000)
    picked: list[int] = []
    for _ in range(100 * count):
        if len(picked) == count:
            return picked
        port = random.randint(lo, hi)
        if port in picked:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        picked.append(port)
    if len(picked) == count:
        return picked
    raise RuntimeError(f"no {count} free ports in {lo}..{hi}")


class ClusterProcess:
    """etcd and three nodes of `partitions` partitions, each replicated on all three. start()
    returns once every partition has a leader serving it and all three nodes in sync. Use as a
    context manager; stop() kills the nodes, then etcd, by their process ids."""

    def __init__(self, partitions: int, config_json: str = "") -> None:
        self.partitions = partitions
        self.config_json = config_json
        self.dir = tempfile.mkdtemp(prefix="jobbroker-py-cluster-")
        # All of one cluster's ports at once, so that no two are the same.
        ports = [f"127.0.0.1:{port}" for port in _free_ports(2 * NODES + 2)]
        self.addresses = ports[:NODES]
        # Each node's HTTP listener, for its /metrics.
        self.http_addresses = ports[NODES:2 * NODES]
        self._etcd_client, self._etcd_peer = ports[2 * NODES:]
        self.nodes: list[subprocess.Popen[bytes]] = []
        self.etcd: subprocess.Popen[bytes] | None = None

    def _log(self, name: str) -> int:
        return os.open(os.path.join(self.dir, f"{name}.log"), os.O_WRONLY | os.O_CREAT, 0o644)

    def start(self) -> ClusterProcess:
        etcd_url = f"http://{self._etcd_client}"
        log = self._log("etcd")
        self.etcd = subprocess.Popen(
            ["etcd", "--data-dir", os.path.join(self.dir, "etcd"),
             "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
             "--listen-peer-urls", f"http://{self._etcd_peer}"],
            stdout=log, stderr=subprocess.STDOUT)
        os.close(log)
        config = os.path.join(self.dir, "config.json")
        with open(config, "w") as f:
            f.write(self.config_json or "{}")
        for n, address in enumerate(self.addresses):
            log = self._log(f"node-{n}")
            self.nodes.append(subprocess.Popen(
                [broker_binary(), "--listen", address, "--http-listen", self.http_addresses[n],
                 "--data-dir", os.path.join(self.dir, f"node-{n}"),
                 "--partitions", str(self.partitions), "--cluster-etcd", etcd_url,
                 "--node-id", f"node-{n}", "--cluster-initial-nodes", str(NODES),
                 "--config", config, "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT))
            os.close(log)
        try:
            self._await_ready(60.0)
        except BaseException:
            self.stop()
            raise
        return self

    def cluster_info(self) -> admin_pb2.ClusterInfo | None:
        """GetCluster from the first node that answers, or None."""
        for address in self.addresses:
            with grpc.insecure_channel(address) as channel:
                try:
                    info: admin_pb2.ClusterInfo = admin_pb2_grpc.AdminStub(channel).GetCluster(
                        admin_pb2.GetClusterRequest(), timeout=5)
                    return info
                except grpc.RpcError:
                    continue
        return None

    def _await_ready(self, give_up_after: float) -> None:
        deadline = time.monotonic() + give_up_after
        while time.monotonic() < deadline:
            info = self.cluster_info()
            if (info is not None and len(info.partitions) == self.partitions
                    and all(p.leader_node_id and len(p.in_sync) == NODES
                            for p in info.partitions)
                    and all(self._serves(p) for p in range(self.partitions))):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the cluster was not ready within {give_up_after} s; logs in "
                           f"{self.dir}")

    def _serves(self, partition: int) -> bool:
        """Whether a call for `partition` gets past "its leader does not serve it yet"
        (UNAVAILABLE while it starts): GetQueue of a queue there, forwarded by any node."""
        queue = next(q for q in (f"ready.{i}" for i in range(1000))
                     if partition_of_queue(q, self.partitions) == partition)
        with grpc.insecure_channel(self.addresses[0]) as channel:
            try:
                admin_pb2_grpc.AdminStub(channel).GetQueue(
                    admin_pb2.GetQueueRequest(queue=queue), timeout=5)
            except grpc.RpcError as err:
                return bool(err.code() not in (grpc.StatusCode.UNAVAILABLE,
                                               grpc.StatusCode.DEADLINE_EXCEEDED))
        return True

    def metric(self, node: int, name: str) -> float:
        """The value of the unlabelled metric `name` in node `node`'s /metrics."""
        url = f"http://{self.http_addresses[node]}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            text = answer.read().decode("utf-8")
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return float(value)
        raise KeyError(f"{name} not in the /metrics of node-{node}")

    def kill9(self, address: str) -> None:
        """kill -9 of the node at `address`: a dead machine."""
        node = self.nodes[self.addresses.index(address)]
        node.kill()
        node.wait()

    def stop(self) -> None:
        for node in self.nodes:
            if node.poll() is None:
                node.send_signal(signal.SIGKILL)
            node.wait()
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.kill()
            self.etcd.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> ClusterProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
