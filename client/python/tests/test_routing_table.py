"""Routing, without a broker: the partition functions against the repository's vectors (which a
C++ test checks against the broker's own code), the routing table from hand-made ClusterInfo
answers, and the worker's stream groups (one per leading node) from such tables."""

from __future__ import annotations

import pathlib

import pytest
from brokerproc import REPO_ROOT

from jobbroker._partition import partition_of_job_id, partition_of_queue
from jobbroker._router import StreamGroup, stream_groups
from jobbroker._routing_table import RoutingTable
from jobbroker.v1 import admin_pb2

VECTORS = pathlib.Path(REPO_ROOT) / "tests" / "client" / "partition_vectors.tsv"


def vector_lines(kind: str) -> list[tuple[str, int, str]]:
    lines = []
    for line in VECTORS.read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        what, key, count, partition = line.split("\t")
        if what == kind:
            lines.append((key, int(count), partition))
    return lines


def test_every_queue_vector_lands_in_its_partition() -> None:
    vectors = vector_lines("queue")
    assert len(vectors) > 100
    wrong = [(q, n, want) for q, n, want in vectors if str(partition_of_queue(q, n)) != want]
    assert wrong == []


def test_every_job_id_vector_lands_in_its_partition_or_none() -> None:
    vectors = vector_lines("job")
    assert len(vectors) > 100
    assert any(want == "none" for _, _, want in vectors)

    def answer(job_id: str, count: int) -> str:
        partition = partition_of_job_id(job_id, count)
        return "none" if partition is None else str(partition)

    wrong = [(j, n, want) for j, n, want in vectors if answer(j, n) != want]
    assert wrong == []


def node(node_id: str, address: str, alive: bool = True) -> admin_pb2.NodeInfo:
    return admin_pb2.NodeInfo(node_id=node_id, address=address, alive=alive)


def three_nodes(**kwargs: object) -> admin_pb2.ClusterInfo:
    """A cluster of 4 partitions on nodes a, b, c; partition 3 has no leader."""
    info = admin_pb2.ClusterInfo(
        cluster_name="jobbroker", partition_count=4,
        nodes=[node("a", "10.0.0.1:7070"), node("b", "10.0.0.2:7070"),
               node("c", "10.0.0.3:7070", alive=False)])
    info.partitions.extend([
        admin_pb2.PartitionInfo(partition=0, leader_node_id="a"),
        admin_pb2.PartitionInfo(partition=1, leader_node_id="b",
                                leader_address="10.0.0.20:7070"),
        admin_pb2.PartitionInfo(partition=2, leader_node_id="c"),
        admin_pb2.PartitionInfo(partition=3),
    ])
    return info


def queue_in(partition: int, count: int = 4) -> str:
    return next(q for q in (f"q{i}" for i in range(1000))
                if partition_of_queue(q, count) == partition)


def test_a_live_leader_takes_its_partitions_calls_at_its_listed_address() -> None:
    table = RoutingTable.from_cluster_info(three_nodes(), "10.0.0.2:7070")
    assert table.is_cluster and table.partition_count == 4
    assert table.address_of_partition(0) == "10.0.0.1:7070"  # the node's address
    assert table.address_of_partition(1) == "10.0.0.20:7070"  # the partition's leader_address
    assert table.address_of_queue(queue_in(0)) == "10.0.0.1:7070"


def test_a_leader_not_alive_or_no_leader_sends_the_call_to_the_node_that_answered() -> None:
    table = RoutingTable.from_cluster_info(three_nodes(), "10.0.0.2:7070")
    assert table.address_of_partition(2) == "10.0.0.2:7070"  # c is not alive
    assert table.address_of_partition(3) == "10.0.0.2:7070"  # no leader
    assert table.address_of_partition(9) == "10.0.0.2:7070"  # out of range
    assert table.any_address() == "10.0.0.2:7070"


def test_a_job_goes_to_the_leader_of_its_ids_partition_and_a_foreign_id_to_any_node() -> None:
    table = RoutingTable.from_cluster_info(three_nodes(), "10.0.0.3:7070")
    job_in_0 = "01ARZ3NDEK000RRFFQ69G5FAV0"  # characters 10..12 are "000"
    job_in_1 = "01ARZ3NDEK001RRFFQ69G5FAV0"
    assert partition_of_job_id(job_in_0, 4) == 0 and partition_of_job_id(job_in_1, 4) == 1
    assert table.address_of_job(job_in_0) == "10.0.0.1:7070"
    assert table.address_of_job(job_in_1) == "10.0.0.20:7070"
    assert table.address_of_job("not-a-job-id") == "10.0.0.3:7070"


def test_the_nodes_to_ask_again_are_the_live_ones_first() -> None:
    table = RoutingTable.from_cluster_info(three_nodes(), "10.0.0.2:7070")
    assert table.node_addresses() == ["10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"]


@pytest.mark.parametrize("table", [
    RoutingTable.from_cluster_info(
        admin_pb2.ClusterInfo(partition_count=1, nodes=[node("solo", "0.0.0.0:7070")],
                              partitions=[admin_pb2.PartitionInfo(leader_node_id="solo")]),
        "broker.internal:7070"),
    RoutingTable.single_broker("broker.internal:7070"),
], ids=["empty cluster_name", "GetCluster refused"])
def test_a_broker_that_is_not_a_cluster_takes_every_call_where_it_was_reached(
        table: RoutingTable) -> None:
    assert not table.is_cluster and not table.empty
    assert table.address_of_queue("emails") == "broker.internal:7070"
    assert table.address_of_job("01ARZ3NDEK001RRFFQ69G5FAV0") == "broker.internal:7070"
    assert table.node_addresses() == ["broker.internal:7070"]


def test_an_empty_table_knows_no_broker() -> None:
    table = RoutingTable()
    assert table.empty and not table.is_cluster
    assert table.node_addresses() == []


def queues_in(partition: int, n: int, count: int = 4) -> list[str]:
    return [q for q in (f"q{i}" for i in range(1000))
            if partition_of_queue(q, count) == partition][:n]


def test_the_worker_streams_to_each_leader_its_queues_and_the_leaderless_ones_to_any_node(
) -> None:
    # Partition 0 led by a, 1 by b (at its leader_address), 2 by c (not alive), 3 by none.
    table = RoutingTable.from_cluster_info(three_nodes(), "10.0.0.2:7070")
    q0, q1, q2, q3 = (queues_in(p, 2) for p in range(4))
    handled = [q3[1], q1[1], q0[1], q2[0], q1[0], q0[0], q3[0]]
    groups = stream_groups(table, handled, 10)
    assert groups == [
        StreamGroup("10.0.0.1:7070", tuple(sorted(q0)), 4),
        StreamGroup("10.0.0.20:7070", tuple(sorted(q1)), 3),
        # c's partition and the leaderless one: one more group, to any node.
        StreamGroup("", tuple(sorted(q2[:1] + q3)), 3),
    ]


@pytest.mark.parametrize(("max_in_flight", "shares"), [
    (2, [1, 1, 1]),  # fewer than the k groups: each at least 1
    (3, [1, 1, 1]),
    (7, [3, 2, 2]),  # the first max % k groups get one more
    (0, [0, 0, 0]),  # stop taking
])
def test_max_in_flight_is_shared_out_over_the_groups_sorted_by_address(
        max_in_flight: int, shares: list[int]) -> None:
    info = admin_pb2.ClusterInfo(
        cluster_name="jobbroker", partition_count=3,
        nodes=[node("a", "10.0.0.3:7070"), node("b", "10.0.0.1:7070"),
               node("c", "10.0.0.2:7070")],
        partitions=[admin_pb2.PartitionInfo(partition=p, leader_node_id=n)
                    for p, n in enumerate("abc")])
    table = RoutingTable.from_cluster_info(info, "10.0.0.3:7070")
    handled = [queues_in(p, 1, 3)[0] for p in range(3)]
    groups = stream_groups(table, handled, max_in_flight)
    assert [g.address for g in groups] == ["10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"]
    assert [g.queues for g in groups] == [(handled[1],), (handled[2],), (handled[0],)]
    assert [g.share for g in groups] == shares


def test_one_leader_of_every_queue_is_one_stream_with_all_of_max_in_flight() -> None:
    info = admin_pb2.ClusterInfo(
        cluster_name="jobbroker", partition_count=2,
        nodes=[node("a", "10.0.0.1:7070"), node("b", "10.0.0.2:7070")],
        partitions=[admin_pb2.PartitionInfo(partition=p, leader_node_id="a") for p in (0, 1)])
    table = RoutingTable.from_cluster_info(info, "10.0.0.2:7070")
    handled = ["zeta", "alpha", *queues_in(1, 2, 2)]
    assert stream_groups(table, handled, 5) == [
        StreamGroup("10.0.0.1:7070", tuple(sorted(handled)), 5)]


@pytest.mark.parametrize(("max_in_flight", "shares"), [(3, [2, 1]), (1, [1, 1]), (4, [2, 2])])
def test_the_group_for_any_node_sorts_last_though_its_address_sorts_first(
        max_in_flight: int, shares: list[int]) -> None:
    # "" (any node) sorts before every address, yet the contract puts its group last: it gets
    # the smaller share when max_in_flight does not divide evenly.
    info = admin_pb2.ClusterInfo(
        cluster_name="jobbroker", partition_count=2,
        nodes=[node("a", "10.0.0.1:7070")],
        partitions=[admin_pb2.PartitionInfo(partition=0, leader_node_id="a"),
                    admin_pb2.PartitionInfo(partition=1)])
    table = RoutingTable.from_cluster_info(info, "10.0.0.1:7070")
    led, leaderless = queues_in(0, 1, 2)[0], queues_in(1, 1, 2)[0]
    assert stream_groups(table, [leaderless, led], max_in_flight) == [
        StreamGroup("10.0.0.1:7070", (led,), shares[0]),
        StreamGroup("", (leaderless,), shares[1]),
    ]
