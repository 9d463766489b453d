"""Routing, without a broker: the partition functions against the repository's vectors (which a
C++ test checks against the broker's own code), and the routing table from hand-made
ClusterInfo answers."""

from __future__ import annotations

import pathlib

import pytest
from brokerproc import REPO_ROOT

from jobbroker._partition import partition_of_job_id, partition_of_queue
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
