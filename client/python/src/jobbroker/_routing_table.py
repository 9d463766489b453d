"""RoutingTable: which broker address a call goes to, from one answer of Admin.GetCluster."""

from __future__ import annotations

from ._partition import partition_of_job_id, partition_of_queue
from .v1 import admin_pb2

__all__ = ["RoutingTable"]


class RoutingTable:
    """The leader of each partition, from one ClusterInfo, and the node that answered it.

    A value: it never changes once built; the router builds a new one when leadership moves.

    Every lookup answers an address to send to: a partition without a leader, a leader listed
    as not alive, or a job id of no known form go to any_address(), a live node that forwards
    the call or answers UNAVAILABLE naming the partition. A broker that is not part of a cluster
    (empty cluster_name) is reached only at the address it answered on: its own idea of its
    address may be a listen address such as 0.0.0.0:7070.
    """

    def __init__(
        self,
        answered_by: str = "",
        *,
        partition_count: int = 1,
        leaders: list[str] | None = None,
        alive_nodes: list[str] | None = None,
        other_nodes: list[str] | None = None,
        partitions_known: bool = True,
    ) -> None:
        """Use the constructors below; RoutingTable() knows no broker (empty)."""
        self._answered_by = answered_by
        self._partition_count = partition_count
        self._partitions_known = partitions_known and bool(answered_by)
        # By partition number; "" where the partition has no live leader with a known address.
        # None: not a cluster.
        self._leaders = leaders
        self._alive_nodes = list(alive_nodes or [])
        self._other_nodes = list(other_nodes or [])

    @classmethod
    def from_cluster_info(cls, info: admin_pb2.ClusterInfo, answered_by: str) -> RoutingTable:
        """From `info`, answered by the broker the client reached at `answered_by`."""
        count = max(1, info.partition_count)
        if not info.cluster_name:
            # Routed like single_broker, but its partition count is known: a single node may
            # have several partitions, and an EnqueueBatch must stay within one of them.
            return cls(answered_by, partition_count=count)
        nodes = {node.node_id: node for node in info.nodes}
        alive = [n.address for n in info.nodes if n.address and n.alive]
        others = [n.address for n in info.nodes if n.address and not n.alive]
        leaders = [""] * count
        for p in info.partitions:
            if p.partition >= count or not p.leader_node_id:
                continue
            node = nodes.get(p.leader_node_id)
            # A leader listed as not alive is about to lose its partition: any node knows
            # better.
            if node is not None and not node.alive:
                continue
            leaders[p.partition] = p.leader_address or (node.address if node else "")
        return cls(answered_by, partition_count=count, leaders=leaders, alive_nodes=alive,
                   other_nodes=others)

    @classmethod
    def single_broker(cls, address: str) -> RoutingTable:
        """Every call goes to `address`: a broker outside a cluster, or one that would not say
        (GetCluster answered UNIMPLEMENTED by an older broker, PERMISSION_DENIED for a token
        without the admin role); any node forwards calls to the partition's leader."""
        return cls(address, partitions_known=False)

    @property
    def is_cluster(self) -> bool:
        """False for a table from an empty cluster_name or from single_broker."""
        return self._leaders is not None

    @property
    def empty(self) -> bool:
        return not self._answered_by

    @property
    def partition_count(self) -> int:
        return self._partition_count

    @property
    def known_partition_count(self) -> int | None:
        """The broker's partition count as GetCluster told it; None when the table is empty or
        the broker would not say."""
        return self._partition_count if self._partitions_known else None

    @property
    def answered_by(self) -> str:
        """Where the table came from."""
        return self._answered_by

    def any_address(self) -> str:
        """A live node, for calls any node serves: the one that answered, which was
        reachable."""
        return self._answered_by

    def address_of_partition(self, partition: int) -> str:
        """The address of the partition's leader; any_address() if it has none (or is out of
        range)."""
        if self._leaders is None or not 0 <= partition < len(self._leaders):
            return self.any_address()
        return self._leaders[partition] or self.any_address()

    def address_of_queue(self, queue: str) -> str:
        """The leader of the partition `queue` lives in."""
        if self._leaders is None:
            return self.any_address()
        return self.address_of_partition(partition_of_queue(queue, self._partition_count))

    def leader_of_queue(self, queue: str) -> str:
        """The address of the leader of `queue`'s partition; "" when the table names none (or
        is not a cluster's)."""
        if self._leaders is None:
            return ""
        partition = partition_of_queue(queue, self._partition_count)
        return self._leaders[partition] if partition < len(self._leaders) else ""

    def address_of_job(self, job_id: str) -> str:
        """The leader of the partition the job lives in; any_address() for an id of another
        form (the broker answers NOT_FOUND or INVALID_ARGUMENT for it)."""
        if self._leaders is None:
            return self.any_address()
        partition = partition_of_job_id(job_id, self._partition_count)
        return self.any_address() if partition is None else self.address_of_partition(partition)

    def node_addresses(self) -> list[str]:
        """Every node listed alive, in GetCluster's order, then those not alive: where to ask
        again when the one that answered is gone. Only answered_by outside a cluster."""
        if self._leaders is None:
            return [] if self.empty else [self._answered_by]
        return self._alive_nodes + self._other_nodes
