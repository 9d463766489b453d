"""ClientOptions against the real broker: TLS and mutual TLS with a throwaway CA, the bearer
token, several addresses, the deadline, the environment, and which calls are retried."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import pathlib
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import grpc
import grpc.aio
import pytest
from brokerproc import BrokerProcess
from conftest import CONFIG, eventually, running_worker, wait_state
from pki import TestPki

import jobbroker
from jobbroker import ClientOptions, NewJob


class CallRecorder(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Counts the attempts of each unary method and keeps the deadline each one was sent with.
    GetCluster is left out: the client asks it of the broker on its own to learn where the
    partitions' leaders are, and that would blur the counts of the calls under test."""

    def __init__(self) -> None:
        self.attempts: collections.Counter[str] = collections.Counter()
        self.timeouts: dict[str, list[float | None]] = collections.defaultdict(list)

    async def intercept_unary_unary(self, continuation: Callable[..., Awaitable[Any]],
                                    details: Any, request: Any) -> Any:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        name = method.rsplit("/", 1)[-1]
        if name == "GetCluster":
            return await continuation(details, request)
        self.attempts[name] += 1
        self.timeouts[name].append(details.timeout)
        return await continuation(details, request)


@pytest.fixture(scope="module")
def stopped_broker_address() -> Iterator[str]:
    """An address where no broker listens, as after it stopped: the port is bound but not
    listening, so connections are refused and no other process can take the port meanwhile."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{held.getsockname()[1]}"


# --- TLS and tokens --------------------------------------------------------------------------

WORKER_TOKEN = "py-test-worker-token"
OPERATOR_TOKEN = "py-test-operator-token"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return TestPki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secured_broker(pki: TestPki, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[BrokerProcess]:
    """Mutual TLS and tokens: a worker token and an operator (producer + admin) token."""
    tokens = tmp_path_factory.mktemp("tokens") / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [
        {"name": "workers", "sha256": hashlib.sha256(WORKER_TOKEN.encode()).hexdigest(),
         "roles": ["worker"], "queues": ["tls.*"]},
        {"name": "operator", "sha256": hashlib.sha256(OPERATOR_TOKEN.encode()).hexdigest(),
         "roles": ["producer", "admin"], "queues": ["*"]},
    ]}))
    with BrokerProcess(CONFIG, extra_args=[*pki.broker_flags(), "--auth-tokens", str(tokens)]
                       ) as b:
        yield b


def tls_options(pki: TestPki, broker: BrokerProcess, token: str) -> ClientOptions:
    return ClientOptions(address=broker.address, tls=str(pki.ca), cert=str(pki.client_cert),
                         key=str(pki.client_key), token=token)


async def test_mutual_tls_and_a_token_reach_a_secured_broker_from_client_and_worker(
        pki: TestPki, secured_broker: BrokerProcess) -> None:
    async with jobbroker.Client(options=tls_options(pki, secured_broker, OPERATOR_TOKEN)) as c:
        res = await c.enqueue("tls.jobs", {"n": 1})
        worker = jobbroker.Worker(options=tls_options(pki, secured_broker, WORKER_TOKEN),
                                  handle_signals=False)
        worker.handle("tls.jobs", lambda job: {"seen": job.json()["n"]})
        async with running_worker(worker):
            done = await wait_state(c, res.job_id, jobbroker.JOB_STATE_COMPLETED)
            listed = await c.list_workers("tls.jobs")
        assert json.loads(done.result) == {"seen": 1}
        assert [w.client.split("/")[0] for w in listed] == ["jobbroker-python"]


async def test_pem_given_inline_works_like_files(
        pki: TestPki, secured_broker: BrokerProcess) -> None:
    options = ClientOptions(address=secured_broker.address, tls=pki.ca.read_bytes(),
                            cert=pki.client_cert.read_text(), key=pki.client_key.read_bytes(),
                            token=OPERATOR_TOKEN)
    async with jobbroker.Client(options=options) as c:
        assert (await c.get_cluster()).partition_count >= 1


async def test_a_wrong_token_is_unauthenticated_and_ends_the_worker(
        pki: TestPki, secured_broker: BrokerProcess) -> None:
    options = tls_options(pki, secured_broker, "not-a-token")
    async with jobbroker.Client(options=options) as c:
        with pytest.raises(jobbroker.UnauthenticatedError):
            await c.enqueue("tls.jobs", "x", dedup_key="refused")
    worker = jobbroker.Worker(options=options, handle_signals=False)
    worker.handle("tls.jobs", lambda job: None)
    with pytest.raises(jobbroker.UnauthenticatedError):
        await worker.run()


async def test_a_worker_token_cannot_enqueue(pki: TestPki, secured_broker: BrokerProcess) -> None:
    async with jobbroker.Client(options=tls_options(pki, secured_broker, WORKER_TOKEN)) as c:
        with pytest.raises(jobbroker.PermissionDeniedError):
            await c.enqueue("tls.jobs", "x")


async def test_without_the_client_certificate_the_handshake_fails(
        pki: TestPki, secured_broker: BrokerProcess) -> None:
    options = ClientOptions(address=secured_broker.address, tls=str(pki.ca),
                            token=OPERATOR_TOKEN, retry_attempts=1)
    async with jobbroker.Client(options=options) as c:
        with pytest.raises(jobbroker.UnavailableError):
            await c.get_cluster()


def test_cert_without_key_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="cert and key"):
        ClientOptions(cert="client.pem")


# --- safe retries ----------------------------------------------------------------------------


async def test_an_enqueue_without_a_dedup_key_is_attempted_once(
        stopped_broker_address: str) -> None:
    calls = CallRecorder()
    options = ClientOptions(address=stopped_broker_address, interceptors=[calls])
    async with jobbroker.Client(options=options) as c:
        with pytest.raises(jobbroker.UnavailableError):
            await c.enqueue("retry", "no key")
        with pytest.raises(jobbroker.UnavailableError):
            await c.enqueue_batch([NewJob("retry", "a", dedup_key="k"), NewJob("retry", "b")])
    assert calls.attempts == {"Enqueue": 1, "EnqueueBatch": 1}


async def test_calls_that_cannot_duplicate_are_attempted_three_times(
        stopped_broker_address: str) -> None:
    calls = CallRecorder()
    options = ClientOptions(address=stopped_broker_address, interceptors=[calls])
    async with jobbroker.Client(options=options) as c:
        for call in (lambda: c.enqueue("retry", "keyed", dedup_key="k"),
                     lambda: c.enqueue_batch([NewJob("retry", "a", dedup_key="a")]),
                     lambda: c.get_job("01ARZ3NDEKTSV4RRFFQ69G5FAV"),
                     lambda: c.list_queues(),
                     lambda: c.ack("01ARZ3NDEKTSV4RRFFQ69G5FAV", "lease")):
            with pytest.raises(jobbroker.UnavailableError):
                await call()
    assert calls.attempts == {"Enqueue": 3, "EnqueueBatch": 3, "GetJob": 3, "ListQueues": 3,
                              "Ack": 3}


async def test_changes_that_could_repeat_are_attempted_once(stopped_broker_address: str) -> None:
    calls = CallRecorder()
    options = ClientOptions(address=stopped_broker_address, interceptors=[calls])
    async with jobbroker.Client(options=options) as c:
        for call in (lambda: c.cancel_job("01ARZ3NDEKTSV4RRFFQ69G5FAV"),
                     lambda: c.trigger_schedule("nightly"),
                     lambda: c.lease("retry")):
            with pytest.raises(jobbroker.UnavailableError):
                await call()
    assert calls.attempts == {"CancelJob": 1, "TriggerSchedule": 1, "Lease": 1}


async def test_retry_attempts_one_turns_retries_off(stopped_broker_address: str) -> None:
    calls = CallRecorder()
    options = ClientOptions(address=stopped_broker_address, interceptors=[calls],
                            retry_attempts=1)
    async with jobbroker.Client(options=options) as c:
        with pytest.raises(jobbroker.UnavailableError):
            await c.list_queues()
    assert calls.attempts == {"ListQueues": 1}


# --- several addresses -----------------------------------------------------------------------


async def test_calls_go_to_the_next_address_when_the_first_does_not_answer(
        stopped_broker_address: str, broker: BrokerProcess) -> None:
    calls = CallRecorder()
    options = ClientOptions(addresses=[stopped_broker_address, broker.address],
                            interceptors=[calls])
    async with jobbroker.Client(options=options) as c:
        # Even an enqueue that is never retried: the client asked where the broker is first.
        res = await c.enqueue("failover", "first try")
        assert (await c.get_job(res.job_id)).payload == b"first try"
    assert calls.attempts == {"Enqueue": 1, "GetJob": 1}


class GetClusterCounter(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Counts the GetCluster calls, the client's own included."""

    def __init__(self) -> None:
        self.count = 0

    async def intercept_unary_unary(self, continuation: Callable[..., Awaitable[Any]],
                                    details: Any, request: Any) -> Any:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        self.count += method.endswith("/GetCluster")
        return await continuation(details, request)


async def test_concurrent_first_calls_share_one_question_of_where_the_broker_is(
        broker: BrokerProcess) -> None:
    lookups = GetClusterCounter()
    options = ClientOptions(address=broker.address, interceptors=[lookups])
    async with jobbroker.Client(options=options) as c:
        await asyncio.gather(*(c.list_queues() for _ in range(10)))
    assert lookups.count == 1


async def test_after_its_broker_stops_a_client_moves_on_to_the_next_address(
        broker: BrokerProcess) -> None:
    with BrokerProcess(CONFIG) as first:
        options = ClientOptions(addresses=[first.address, broker.address])
        async with jobbroker.Client(options=options) as c:
            res = await c.enqueue("failover", "on the first")
            assert (await c.get_job(res.job_id)).payload == b"on the first"
            first.kill()
            # Not retried: it fails, and the next call asks again where the broker is.
            with pytest.raises(jobbroker.UnavailableError):
                await c.enqueue("failover", "lost")
            res = await c.enqueue("failover", "on the next")
            assert (await c.get_job(res.job_id)).payload == b"on the next"


async def test_the_worker_reconnects_to_the_next_address(
        stopped_broker_address: str, broker: BrokerProcess, client: jobbroker.Client) -> None:
    worker = jobbroker.Worker(
        options=ClientOptions(addresses=[stopped_broker_address, broker.address]),
        handle_signals=False)
    worker.handle("failover.work", lambda job: "done")
    res = await client.enqueue("failover.work", "x")
    async with running_worker(worker):
        await wait_state(client, res.job_id, jobbroker.JOB_STATE_COMPLETED)


# --- deadline and environment ----------------------------------------------------------------


async def test_unary_calls_carry_the_default_deadline_unless_overridden(
        broker: BrokerProcess) -> None:
    calls = CallRecorder()
    async with jobbroker.Client(options=ClientOptions(address=broker.address,
                                                      interceptors=[calls])) as c:
        await c.list_queues()
        await c.list_queues(deadline=2.5)
    async with jobbroker.Client(broker.address, deadline=None,
                                options=ClientOptions(interceptors=[calls])) as c:
        await c.list_queues()
    assert calls.timeouts["ListQueues"] == [10.0, 2.5, None]


def test_address_and_token_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBBROKER_ADDRESS", "10.1.0.1:7070, 10.1.0.2:7070")
    monkeypatch.setenv("JOBBROKER_TOKEN", "from-env")
    options = ClientOptions()
    assert options.targets() == ["10.1.0.1:7070", "10.1.0.2:7070"]
    assert ("authorization", "Bearer from-env") in options.metadata()
    assert ("jobbroker-client", f"jobbroker-python/{jobbroker.__version__}") in options.metadata()
    # Set explicitly, they win; an empty token sends none.
    explicit = ClientOptions(address="broker:7070", token="")
    assert explicit.targets() == ["broker:7070"]
    # A comma-separated address names a cluster's nodes, as the variable does.
    assert ClientOptions(address="n1:7070,n2:7070").targets() == ["n1:7070", "n2:7070"]
    assert [k for k, _ in explicit.metadata()] == ["jobbroker-client"]


async def test_the_environment_token_reaches_the_broker(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    token = "env-token"
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [{
        "name": "env", "sha256": hashlib.sha256(token.encode()).hexdigest(),
        "roles": ["admin"], "queues": ["*"]}]}))
    with BrokerProcess(CONFIG, extra_args=["--auth-tokens", str(tokens)]) as secured:
        monkeypatch.setenv("JOBBROKER_ADDRESS", secured.address)
        monkeypatch.setenv("JOBBROKER_TOKEN", token)
        async with jobbroker.Client() as c:
            assert await c.list_queues() == []


async def test_list_workers_shows_the_library(broker: BrokerProcess,
                                              client: jobbroker.Client) -> None:
    worker = jobbroker.Worker(options=ClientOptions(address=broker.address),
                              worker_id="listed-worker", handle_signals=False)
    worker.handle("listed", lambda job: None)
    async with running_worker(worker):
        async def listed() -> bool:
            return any(w.worker_id == "listed-worker" and w.streams > 0
                       for w in await client.list_workers("listed"))

        await eventually(listed, what="the worker in ListWorkers")
        [info] = [w for w in await client.list_workers("listed")
                  if w.worker_id == "listed-worker"]
    assert info.client == f"jobbroker-python/{jobbroker.__version__}"
    assert list(info.queues) == ["listed"]
