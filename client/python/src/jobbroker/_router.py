"""Router: what the Client and the Worker share to reach a cluster's nodes."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio

from ._metadata import Metadata
from ._routing_table import RoutingTable
from .options import ClientOptions
from .v1 import admin_pb2, admin_pb2_grpc, broker_pb2_grpc

__all__ = ["Node", "Route", "Router", "StreamGroup", "stream_groups", "GIVEN_CHANNEL"]

# The name of the one node there is when the caller gives its own channel.
GIVEN_CHANNEL = "<given channel>"

# Codes after which the node a call went to may no longer lead its partition, or be gone.
_UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class Node:
    """One node's channel and stubs; stays valid after the table changes."""

    def __init__(self, address: str, channel: grpc.aio.Channel) -> None:
        self.address = address
        self.channel = channel
        self.broker = broker_pb2_grpc.BrokerStub(channel)
        self.admin = admin_pb2_grpc.AdminStub(channel)


@dataclasses.dataclass(frozen=True)
class Route:
    """Which node a call is for: any node, the leader of a queue's partition, or the leader of
    a job's partition."""

    queue: str | None = None
    job_id: str | None = None

    @classmethod
    def any(cls) -> Route:
        return cls()

    @classmethod
    def of_queue(cls, queue: str) -> Route:
        return cls(queue=queue)

    @classmethod
    def of_job(cls, job_id: str) -> Route:
        return cls(job_id=job_id)


@dataclasses.dataclass(frozen=True)
class StreamGroup:
    """One Work stream of a worker (worker contract §5): the node it goes to ("" for any node),
    the queues it subscribes to, sorted, and its share of max_in_flight. Two streams with equal
    groups are the same stream: regrouping keeps it running."""

    address: str
    queues: tuple[str, ...]
    share: int


def stream_groups(
    table: RoutingTable, queues: Sequence[str], max_in_flight: int
) -> list[StreamGroup]:
    """The worker's streams for `queues` by `table` (a cluster's): one group per leader address,
    sorted by address, then one more for the queues whose partition has no leader in the table,
    addressed "" (any node: it relays them, or answers UNAVAILABLE). The i-th of k groups gets
    max_in_flight // k, plus 1 when i < max_in_flight % k, and at least 1, as the broker shares
    a relayed stream's; a max_in_flight of 0 (stop taking) is 0 for every group."""
    by_leader: dict[str, list[str]] = {}
    for queue in sorted(set(queues)):
        by_leader.setdefault(table.leader_of_queue(queue), []).append(queue)
    leaderless = by_leader.pop("", None)
    addresses = sorted(by_leader)
    if leaderless is not None:
        addresses.append("")
        by_leader[""] = leaderless
    k = len(addresses)
    groups = []
    for i, address in enumerate(addresses):
        if max_in_flight <= 0:
            share = 0
        else:
            share = max(1, max_in_flight // k + (1 if i < max_in_flight % k else 0))
        groups.append(StreamGroup(address, tuple(by_leader[address]), share))
    return groups


class _State(enum.Enum):
    UNKNOWN = 0  # no address has answered GetCluster yet
    FRESH = 1
    STALE = 2  # a call failed in a way that may mean it went to the wrong node


class Router:
    """The given addresses, one channel per node (dialled on first use and kept, with the
    options' TLS and interceptors), and the RoutingTable from the latest Admin.GetCluster
    answer.

    The table is fetched before the first call, and again before the next call after
    mark_stale() (a call failed UNAVAILABLE or DEADLINE_EXCEEDED: a leader moved, a node died),
    from whichever address answers first: the nodes of the last table, then the given
    addresses, those whose channel failed its last connect last. A broker that answers
    GetCluster with an error (UNIMPLEMENTED from a broker older than cluster mode,
    PERMISSION_DENIED for a token without the admin role) is used for every call: any node
    forwards calls to the partition's leader. While no address has answered yet, calls go to
    the first given address and every call asks again. A single broker outside a cluster,
    reached at its one address, is asked once.

    The lookups are ordinary calls on the nodes' channels: the options' interceptors see them.
    With a given channel there is no routing: every call uses it.

    Used from one event loop. One refresh runs at a time; calls that find the table stale
    meanwhile wait for it and use its answer.
    """

    def __init__(
        self,
        options: ClientOptions,
        *,
        channel: grpc.aio.Channel | None = None,
        channel_args: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self._options = options
        self._metadata: Metadata = options.metadata()
        self._channel_args = list(channel_args)
        self._given_channel = channel
        self._nodes: dict[str, Node] = {}
        self._state = _State.UNKNOWN
        self._table = RoutingTable()
        self._refresh_lock = asyncio.Lock()
        if channel is not None:
            self.addresses = [GIVEN_CHANNEL]
            self.first = Node(GIVEN_CHANNEL, channel)
        else:
            self.addresses = options.targets()
            self.first = self.node_at(self.addresses[0])

    async def node_for(self, route: Route) -> Node:
        """The node to send a call for `route` to, after fetching the table if it is stale."""
        await self._refresh_if_needed()
        if self._given_channel is not None or self._table.empty:
            return self.first
        if route.queue is not None:
            address = self._table.address_of_queue(route.queue)
        elif route.job_id is not None:
            address = self._table.address_of_job(route.job_id)
        else:
            address = self._table.any_address()
        return self.node_at(address)

    def node_at(self, address: str) -> Node:
        """The node at `address`, dialled now if new (the given channel's, if there is one)."""
        if self._given_channel is not None:
            return self.first
        node = self._nodes.get(address)
        if node is None:
            node = Node(address, self._options.open_channel(address, self._channel_args))
            self._nodes[address] = node
        return node

    def current(self) -> Node:
        """The node calls for any node go to now, without asking anything."""
        if self._given_channel is not None or self._table.empty:
            return self.first
        return self.node_at(self._table.any_address())

    def held_partition_count(self) -> int | None:
        """The partition count of the table held now, without asking anything (the producer's
        coalescer keys batches by partition on every enqueue); None with a given channel, before
        any table, or when the broker would not say."""
        if self._given_channel is not None:
            return None
        return self._table.known_partition_count

    def mark_stale(self) -> None:
        """After a call failed UNAVAILABLE or DEADLINE_EXCEEDED: the next node_for (or table)
        fetches the table first."""
        if self._state is _State.FRESH:
            self._state = _State.STALE

    def note_failure(self, err: grpc.aio.AioRpcError) -> None:
        """mark_stale() if `err` may mean the call went to the wrong node."""
        if err.code() in _UNREACHABLE:
            self.mark_stale()

    async def table(self) -> RoutingTable:
        """The table as it is now, after fetching it if it is stale; empty with a given
        channel or while no address answers."""
        await self._refresh_if_needed()
        return self._table

    async def close(self) -> None:
        """Closes the channels this router dialled (never a given one)."""
        nodes, self._nodes = list(self._nodes.values()), {}
        for node in nodes:
            await node.channel.close(None)

    def _needs_refresh(self) -> bool:
        if self._given_channel is not None or self._state is _State.FRESH:
            return False
        if self._state is _State.UNKNOWN:
            return True
        # One broker outside a cluster, at the one address given: asking it again could only
        # tell the same.
        return self._table.is_cluster or len(self.addresses) > 1

    async def _refresh_if_needed(self) -> None:
        if not self._needs_refresh():
            return
        async with self._refresh_lock:
            if not self._needs_refresh():
                return  # the refresh another call waited for answered meanwhile
            candidates: list[Node] = []
            for address in self._table.node_addresses() + self.addresses:
                node = self.node_at(address)
                if node not in candidates:
                    candidates.append(node)
            # A channel that failed its last connect goes last (a stable sort keeps the order
            # of the others).
            candidates.sort(
                key=lambda n: n.channel.get_state() is grpc.ChannelConnectivity.TRANSIENT_FAILURE
            )
            table = await self._fetch(candidates)
            if table is None:
                return  # the old table (or none) stays, and stays stale
            self._table = table
            self._state = _State.FRESH

    async def _fetch(self, candidates: list[Node]) -> RoutingTable | None:
        """GetCluster from the first candidate that answers; None if none did."""
        for node in candidates:
            try:
                info = await node.admin.GetCluster(
                    admin_pb2.GetClusterRequest(),
                    timeout=self._options.deadline,
                    metadata=self._metadata,
                )
            except grpc.aio.AioRpcError as err:
                if err.code() in _UNREACHABLE:
                    continue
                # It answered but will not say (an older broker, a token without the admin
                # role): it serves every call, forwarding what it does not lead.
                return RoutingTable.single_broker(node.address)
            return RoutingTable.from_cluster_info(info, node.address)
        return None
