"""Keepalive: the channels ping the broker, so a worker whose broker froze (SIGSTOP here; a
broker that lost power or sits behind a firewall that drops packets looks the same) gives the
connection up and reconnects instead of waiting on it forever."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import signal

import pytest
from brokerproc import BrokerProcess
from conftest import CONFIG, eventually, running_worker, wait_state

import jobbroker
from jobbroker import ClientOptions

_ESTABLISHED = "01"  # the state column of /proc/net/tcp and /proc/net/tcp6


def _established(local_port: int, remote_port: int) -> bool:
    """Whether a TCP connection from `local_port` to `remote_port` is ESTABLISHED. gRPC may
    open an IPv6 socket for 127.0.0.1 (as ::ffff:127.0.0.1): /proc/net/tcp6 lists those."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in pathlib.Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, state = fields[1], fields[2], fields[3]
            if (int(local.rsplit(":", 1)[1], 16) == local_port
                    and int(remote.rsplit(":", 1)[1], 16) == remote_port
                    and state == _ESTABLISHED):
                return True
    return False


def test_the_default_keepalive_pings_every_10_s_with_or_without_calls() -> None:
    options = ClientOptions()
    assert (options.keepalive_time, options.keepalive_timeout) == (10.0, 5.0)
    assert options.channel_args() == [
        ("grpc.keepalive_time_ms", 10000),
        ("grpc.keepalive_timeout_ms", 5000),
        ("grpc.http2.ping_timeout_ms", 5000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    short = ClientOptions(keepalive_time=1.5, keepalive_timeout=0.25)
    assert dict(short.channel_args())["grpc.keepalive_time_ms"] == 1500
    assert dict(short.channel_args())["grpc.keepalive_timeout_ms"] == 250
    assert dict(short.channel_args())["grpc.http2.ping_timeout_ms"] == 250
    # None turns the pings off: gRPC's own default (no keepalive) stays.
    assert ClientOptions(keepalive_time=None).channel_args() == []


def test_channel_options_win_over_the_keepalive_and_the_workers_backoff() -> None:
    backoff = [("grpc.max_reconnect_backoff_ms", 5000)]
    options = ClientOptions(channel_options=[("grpc.keepalive_time_ms", 60000),
                                             ("grpc.max_reconnect_backoff_ms", 1000)])
    args = options.channel_args(backoff)
    # gRPC takes the first of a repeated key: each key is given once, the user's value.
    keys = [key for key, _ in args]
    assert len(keys) == len(set(keys))
    assert dict(args)["grpc.keepalive_time_ms"] == 60000
    assert dict(args)["grpc.max_reconnect_backoff_ms"] == 1000
    assert dict(args)["grpc.keepalive_timeout_ms"] == 5000


@pytest.mark.parametrize("field, value, error", [
    ("keepalive_time", 0, ValueError),
    ("keepalive_time", -1.0, ValueError),
    ("keepalive_time", float("inf"), ValueError),
    ("keepalive_time", float("nan"), ValueError),
    ("keepalive_time", "10", TypeError),
    ("keepalive_time", True, TypeError),
    ("keepalive_timeout", 0, ValueError),
    ("keepalive_timeout", None, TypeError),
    ("keepalive_timeout", 10**7, ValueError),
])
def test_a_bad_keepalive_is_refused_at_once(field: str, value: object,
                                            error: type[Exception]) -> None:
    with pytest.raises(error, match=f"ClientOptions.{field}"):
        ClientOptions(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(error, match=f"ClientOptions.{field}"):
        dataclasses.replace(ClientOptions(), **{field: value})


async def test_a_worker_gives_up_a_frozen_broker_and_comes_back_on_its_own() -> None:
    """SIGSTOP: the broker's port still accepts and acknowledges TCP, but nothing answers.
    With keepalive the worker's stream ends and its connection is closed within a couple of
    seconds; without it, both would stay open for as long as the broker stays stopped."""
    broker = BrokerProcess(CONFIG).start()
    assert broker.proc is not None
    pid = broker.proc.pid
    broker_port = int(broker.address.rsplit(":", 1)[1])
    options = ClientOptions(address=broker.address, keepalive_time=1, keepalive_timeout=1)
    # 2 s leases: should the job after the thaw go to a connection the worker tried while the
    # broker was frozen, and closed just as the broker answered it, it comes back in seconds.
    worker = jobbroker.Worker(options=options, worker_id="keepalive-worker", lease_duration=2,
                              reconnect_initial=0.05, reconnect_max=0.5, handle_signals=False)
    ran: list[str] = []

    @worker.handler("keepalive")
    async def record(job: jobbroker.JobContext) -> None:
        ran.append(job.text)

    stopped = False
    try:
        async with running_worker(worker):
            try:
                async with jobbroker.Client(broker.address, timeout=30) as c:
                    before = await c.enqueue("keepalive", "before")
                    await wait_state(c, before.job_id, jobbroker.JOB_STATE_COMPLETED)
                    [listed] = [w for w in await c.list_workers("keepalive")
                                if w.worker_id == "keepalive-worker"]
                # The worker's end of its connection: "ipv4:127.0.0.1:PORT".
                worker_port = int(listed.peer.rsplit(":", 1)[1])
                assert _established(worker_port, broker_port)
                reconnects = worker.stats.reconnects

                os.kill(pid, signal.SIGSTOP)
                stopped = True

                async def given_up() -> bool:
                    return (worker.stats.reconnects > reconnects
                            and not _established(worker_port, broker_port))

                await eventually(given_up, timeout=30,
                                 what="the worker to give up the frozen broker's connection")
                assert broker.proc.poll() is None  # still there, still stopped
            finally:
                if stopped:
                    os.kill(pid, signal.SIGCONT)
                    stopped = False
            # The same worker, not restarted, takes the next job.
            async with jobbroker.Client(broker.address, timeout=30) as c:
                after = await c.enqueue("keepalive", "after")
                done = await wait_state(c, after.job_id, jobbroker.JOB_STATE_COMPLETED)
                assert done.attempts[-1].worker_id == "keepalive-worker"
        assert ran == ["before", "after"]
    finally:
        if stopped:
            os.kill(pid, signal.SIGCONT)
        broker.stop()
        broker.cleanup()
