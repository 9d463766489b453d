"""The worker conformance harness: every language's worker through the same scenarios.

    client/python/.venv/bin/python tests/interop/conformance.py [--lang L ...] [--scenario S ...]

For each language, builds its conformance worker (tests/interop/<lang>/build.sh), starts the
real broker (fresh data dir, 100 ms retry backoff without jitter), and runs every scenario with
a fresh queue and a fresh worker process (tests/interop/<lang>/run.sh): the worker protocol is
in tests/interop/CONFORMANCE.md, the behaviour each scenario checks in docs/worker-contract.md.
Every scenario ends with a SIGTERM that must stop the worker gracefully (exit 0, `stopped`).

Prints the language x scenario matrix and each failure's reasons; exits 1 unless every cell
passed. A language whose build failed fails all its cells.

The harness speaks gRPC through the Python client's generated stubs only (never the helper
under test), so a bug in the Python helper cannot hide one in the harness.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import duration_pb2

from jobbroker.v1 import admin_pb2, admin_pb2_grpc, broker_pb2, broker_pb2_grpc, job_pb2

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LANGS = ["cpp", "python", "go", "typescript", "java", "rust", "ruby"]
# A bound for "this is not going to happen", never a measurement: every wait that reaches it
# is a failure, and a passing run never comes near it (leases here are 1 s, backoff 100 ms).
GIVE_UP = 30.0
POLL = 0.05

STATE = job_pb2.JobState
COMPLETED = job_pb2.JOB_STATE_COMPLETED
TERMINAL = {job_pb2.JOB_STATE_COMPLETED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED}


class ScenarioFailed(Exception):
    """A check did not hold; the message says which and what was seen."""


def check(cond: bool, message: str) -> None:
    if not cond:
        raise ScenarioFailed(message)


def state_name(state: int) -> str:
    return STATE.Name(state).removeprefix("JOB_STATE_")


_ports_lock = threading.Lock()
_ports_given: set[int] = set()


def free_port() -> int:
    # The broker must come back on the same address after a kill -9 (scenario reconnect), so
    # the harness picks the port instead of letting the broker take port 0. Languages run side
    # by side: a port is handed out once per run, so two brokers never race for one. Picked at
    # random below the kernel's ephemeral range (as tests/testing/process_util.h does): a port
    # from there is never an outgoing connection's local port, which one that bind(0) handed
    # out (and released) could become before the broker binds it.
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass  # not Linux: the default range
    hi = min(low, 32768) - 1
    lo = max(1024, hi - 12000)
    for _ in range(1000):
        port = random.randint(lo, hi)
        with _ports_lock:
            if port in _ports_given:
                continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        with _ports_lock:
            if port not in _ports_given:
                _ports_given.add(port)
                return port
    raise RuntimeError(f"no free port in {lo}..{hi}")


def seconds(ms: int) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromMilliseconds(ms)
    return d


def ts(t: Any) -> float:
    return t.seconds + t.nanos / 1e9


class Pki:
    """A throwaway CA (openssl), the broker's certificate for 127.0.0.1, a client certificate,
    and a token file: a worker token (role worker) and the harness's operator token (producer
    and admin), both on the conformance.* queues."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir()
        self.folder = folder
        self.ca = folder / "ca.pem"
        self.server_cert, self.server_key = folder / "server.pem", folder / "server.key"
        self.client_cert, self.client_key = folder / "client.pem", folder / "client.key"

        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=folder)

        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        openssl("req", "-x509", *ec, "-days", "1", "-subj", "/CN=conformance CA",
                "-keyout", "ca.key", "-out", "ca.pem")
        for name, ext in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
                          ("client", "extendedKeyUsage=clientAuth")):
            openssl("req", *ec, "-subj", f"/CN=conformance {name}", "-keyout", f"{name}.key",
                    "-out", f"{name}.csr")
            (folder / f"{name}.ext").write_text(ext + "\n")
            openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                    "-CAcreateserial", "-days", "1", "-extfile", f"{name}.ext",
                    "-out", f"{name}.pem")
        self.worker_token = "conformance-worker-" + os.urandom(8).hex()
        self.operator_token = "conformance-operator-" + os.urandom(8).hex()
        self.tokens = folder / "tokens.json"
        self.tokens.write_text(json.dumps({"tokens": [
            {"name": "worker", "sha256": hashlib.sha256(self.worker_token.encode()).hexdigest(),
             "roles": ["worker"], "queues": ["conformance.*"]},
            {"name": "operator",
             "sha256": hashlib.sha256(self.operator_token.encode()).hexdigest(),
             "roles": ["producer", "admin"], "queues": ["*"]},
        ]}))

    def broker_flags(self) -> list[str]:
        return ["--tls-cert", str(self.server_cert), "--tls-key", str(self.server_key),
                "--tls-client-ca", str(self.ca), "--auth-tokens", str(self.tokens)]

    def worker_flags(self, token: str) -> list[str]:
        return ["--ca", str(self.ca), "--cert", str(self.client_cert), "--key",
                str(self.client_key), "--token", token]

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca.read_bytes(), private_key=self.client_key.read_bytes(),
            certificate_chain=self.client_cert.read_bytes())


class Broker:
    """The real broker on a fixed loopback port with its own data dir; kill9() + start() is a
    crash and a restart on the same address and data."""

    def __init__(self, binary: str, workdir: Path, pki: Pki | None = None) -> None:
        """With `pki`, the broker serves TLS, requires client certificates of the test CA
        (mutual TLS) and bearer tokens (pki.tokens); the harness calls with the operator's."""
        self.binary = binary
        self.workdir = workdir
        self.pki = pki
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        config = workdir / "config.json"
        config.write_text(
            json.dumps(
                {
                    "defaultPolicy": {
                        "retry": {
                            "maxAttempts": 5,
                            "initialBackoff": "0.1s",
                            "maxBackoff": "0.1s",
                            "jitter": "JITTER_NONE",
                        }
                    }
                }
            )
        )
        self.config = config
        (workdir / "data").mkdir()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.start()
        self.metadata: list[tuple[str, str]] = []
        if pki is None:
            self.channel = grpc.insecure_channel(self.address)
        else:
            self.channel = grpc.secure_channel(self.address, pki.credentials())
            self.metadata = [("authorization", f"Bearer {pki.operator_token}")]
        self.broker = broker_pb2_grpc.BrokerStub(self.channel)
        self.admin = admin_pb2_grpc.AdminStub(self.channel)

    def start(self) -> None:
        self.starts += 1
        log = open(self.workdir / f"broker.{self.starts}.log", "wb")
        self.proc = subprocess.Popen(
            [self.binary, "--listen", self.address, "--http-listen", "127.0.0.1:0",
             "--data-dir", str(self.workdir / "data"), "--config", str(self.config),
             "--log-level", "warn", *(self.pki.broker_flags() if self.pki else [])],
            stdout=subprocess.PIPE, stderr=log)
        log.close()
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            if raw.decode(errors="replace").startswith("jobbroker: serving grpc="):
                break
        else:
            self.proc.wait()
            raise RuntimeError(f"broker exited ({self.proc.returncode}) before serving; "
                               f"see {self.workdir}/broker.{self.starts}.log")
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        self.channel.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=GIVE_UP)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    # --- calls (retried while the broker restarts) -------------------------------------------

    def call(self, fn: Callable[..., Any], request: Any) -> Any:
        deadline = time.monotonic() + GIVE_UP
        while True:
            try:
                return fn(request, timeout=5, wait_for_ready=True, metadata=self.metadata)
            except grpc.RpcError as err:
                if err.code() not in (grpc.StatusCode.UNAVAILABLE,
                                      grpc.StatusCode.DEADLINE_EXCEEDED) \
                        or time.monotonic() > deadline:
                    raise
                time.sleep(POLL)

    def enqueue(self, queue: str, payload: dict[str, Any], timeout_ms: int = 0) -> str:
        req = broker_pb2.EnqueueRequest(queue=queue, payload=json.dumps(payload).encode())
        if timeout_ms:
            req.timeout.CopyFrom(seconds(timeout_ms))
        return self.call(self.broker.Enqueue, req).job_id

    def job(self, job_id: str) -> job_pb2.Job:
        return self.call(self.admin.GetJob, admin_pb2.GetJobRequest(job_id=job_id))

    def wait_job(self, job_id: str, what: str,
                 pred: Callable[[job_pb2.Job], bool]) -> job_pb2.Job:
        deadline = time.monotonic() + GIVE_UP
        while True:
            job = self.job(job_id)
            if pred(job):
                return job
            if time.monotonic() > deadline:
                raise ScenarioFailed(f"job {job_id} never became {what}: it is "
                                     f"{state_name(job.state)}, attempt {job.attempt}, "
                                     f"last error {job.last_error!r}")
            time.sleep(POLL)

    def wait_state(self, job_id: str, state: int) -> job_pb2.Job:
        return self.wait_job(job_id, state_name(state), lambda j: j.state == state)


class Cluster(Broker):
    """A real etcd and three nodes (2 partitions, every one replicated on all three, a write
    durable on 2 before it is answered). The harness's channel names all three addresses
    (gRPC's pick_first moves to the next when one dies); kill9(node) is a dead machine."""

    NODES = 3

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.pki = None
        workdir.mkdir(exist_ok=True)
        self.config = workdir / "config.json"
        self.config.write_text(json.dumps({"defaultPolicy": {"retry": {
            "maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "0.1s",
            "jitter": "JITTER_NONE"}}}))
        etcd_client, etcd_peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{etcd_client}"
        with open(workdir / "etcd.log", "wb") as log:
            self.etcd = subprocess.Popen(
                ["etcd", "--data-dir", str(workdir / "etcd"),
                 "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
                 "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}"],
                stdout=log, stderr=subprocess.STDOUT)
        self.addresses = [f"127.0.0.1:{free_port()}" for _ in range(self.NODES)]
        self.http_addresses = [f"127.0.0.1:{free_port()}" for _ in range(self.NODES)]
        self.nodes: list[subprocess.Popen[bytes] | None] = [None] * self.NODES
        self.address = ",".join(self.addresses)
        self.metadata = []
        self.channel = grpc.insecure_channel("ipv4:" + self.address)
        self.broker = broker_pb2_grpc.BrokerStub(self.channel)
        self.admin = admin_pb2_grpc.AdminStub(self.channel)
        for n in range(self.NODES):
            self.start_node(n)
        self.wait_replicated()

    def start_node(self, n: int) -> None:
        with open(self.workdir / f"node-{n}.log", "ab") as log:
            self.nodes[n] = subprocess.Popen(
                [self.binary, "--listen", self.addresses[n], "--http-listen", self.http_addresses[n],
                 "--data-dir", str(self.workdir / f"node-{n}"), "--partitions", "2",
                 "--cluster-etcd", self.etcd_url, "--node-id", f"node-{n}",
                 "--cluster-initial-nodes", str(self.NODES), "--config", str(self.config),
                 "--log-level", "warn"],
                stdout=subprocess.DEVNULL, stderr=log)

    def wait_replicated(self) -> None:
        """Until every partition has a leader and all three nodes in sync."""
        deadline = time.monotonic() + 2 * GIVE_UP
        while True:
            with contextlib.suppress(grpc.RpcError):
                info = self.admin.GetCluster(admin_pb2.GetClusterRequest(), timeout=2)
                if info.partitions and all(p.leader_node_id and len(p.in_sync) == self.NODES
                                           for p in info.partitions):
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster never had every partition in sync on all "
                                   f"{self.NODES} nodes; logs in {self.workdir}")
            time.sleep(0.2)

    def leaders(self) -> dict[int, int]:
        """Partition -> the index of the node leading it, once every partition has a leader and
        no node leads two (the controller moves leaders back to their preferred nodes after a
        start); raises if that never happens."""
        deadline = time.monotonic() + 2 * GIVE_UP
        while True:
            with contextlib.suppress(grpc.RpcError):
                info = self.admin.GetCluster(admin_pb2.GetClusterRequest(), timeout=2)
                led = {p.partition: int(p.leader_node_id.removeprefix("node-"))
                       for p in info.partitions if p.leader_node_id}
                if len(led) == info.partition_count and len(set(led.values())) == len(led):
                    return led
            if time.monotonic() > deadline:
                raise ScenarioFailed("the partitions never had leaders on different nodes")
            time.sleep(0.2)

    def metric(self, n: int, name: str) -> float:
        """A gauge of node n, from its /metrics."""
        url = f"http://{self.http_addresses[n]}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            for line in answer.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        raise ScenarioFailed(f"node-{n} has no {name} in its /metrics")

    def leader_of(self, queue: str) -> int:
        info = self.call(self.admin.GetQueue, admin_pb2.GetQueueRequest(queue=queue))
        return int(info.leader_node_id.removeprefix("node-"))

    def kill9(self, n: int = 0) -> None:  # type: ignore[override]
        node = self.nodes[n]
        assert node is not None
        node.kill()
        node.wait()

    def start(self) -> None:  # Broker.start: only a dead node comes back, by start_node
        pass

    def stop(self) -> None:
        self.channel.close()
        for node in self.nodes:
            if node is not None and node.poll() is None:
                node.send_signal(signal.SIGTERM)
        for node in self.nodes:
            if node is not None:
                try:
                    node.wait(timeout=GIVE_UP)
                except subprocess.TimeoutExpired:
                    node.kill()
                    node.wait()
        self.etcd.kill()
        self.etcd.wait()


class Worker:
    """One conformance worker process (tests/interop/<lang>/run.sh) and its events file."""

    def __init__(self, lang: str, workdir: Path, name: str, args: list[str]) -> None:
        self.lang = lang
        self.events_path = workdir / f"{name}.events"
        self.events_path.touch()
        self.log_path = workdir / f"{name}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [str(HERE / lang / "run.sh"), "--events", str(self.events_path),
                 "--lang-name", lang, *args],
                stdout=log, stderr=subprocess.STDOUT, cwd=str(workdir),
                # Its own session: signals meant for the harness's process group never reach it,
                # and a SIGSTOPped worker gets no SIGHUP when some process of that group exits
                # and leaves the group orphaned (POSIX sends SIGHUP + SIGCONT to a stopped
                # member then).
                start_new_session=True)

    def events(self, kind: str | None = None, job: str | None = None) -> list[dict[str, Any]]:
        found = []
        for line in self.events_path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line still being written
            if (kind is None or event.get("event") == kind) and \
                    (job is None or event.get("job") == job):
                found.append(event)
        return found

    def wait_event(self, kind: str, job: str | None = None,
                   pred: Callable[[dict[str, Any]], bool] = lambda e: True) -> dict[str, Any]:
        deadline = time.monotonic() + GIVE_UP
        while True:
            for event in self.events(kind, job):
                if pred(event):
                    return event
            if self.proc.poll() is not None:
                raise ScenarioFailed(f"{self.lang} worker exited ({self.proc.returncode}) "
                                     f"before a {kind!r} event{' of ' + job if job else ''}"
                                     f"\n{self.tail()}")
            if time.monotonic() > deadline:
                raise ScenarioFailed(f"no {kind!r} event{' of ' + job if job else ''} from the "
                                     f"{self.lang} worker\n{self.tail()}")
            time.sleep(POLL)

    def wait_exit(self) -> int:
        try:
            return self.proc.wait(timeout=GIVE_UP)
        except subprocess.TimeoutExpired:
            raise ScenarioFailed(f"{self.lang} worker did not exit\n{self.tail()}") from None

    def stop_gracefully(self) -> None:
        """SIGTERM: the worker must write `stopped` and exit 0."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.wait_stopped()

    def wait_stopped(self) -> None:
        """For a worker already sent SIGTERM: it must write `stopped` and exit 0. No second
        signal: one sent while the worker finishes its stop can land after its library has given
        the signal back to the default action, which kills the process (exit -15) although the
        stop was done (seen in TypeScript's grace_then_cancel, 1 run in 20)."""
        code = self.wait_exit()
        check(code == 0, f"SIGTERM: exit {code}, want 0\n{self.tail()}")
        check(bool(self.events("stopped")), f"SIGTERM: no 'stopped' event\n{self.tail()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()

    def tail(self, lines: int = 12) -> str:
        text = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "  worker log: " + ("\n  ".join(text[-lines:]) if text else "(empty)")


class Run:
    """One scenario of one language: its queue, its worker processes, its scratch folder."""

    def __init__(self, lang: str, scenario: str, broker: Broker, workdir: Path) -> None:
        self.lang = lang
        self.scenario = scenario
        self.broker = broker
        self.workdir = workdir / scenario
        self.workdir.mkdir()
        self.queue = f"conformance.{scenario}"
        self.workers: list[Worker] = []
        self.secured: Broker | None = None

    def worker(self, *args: str, queues: list[str] | None = None) -> Worker:
        w = Worker(self.lang, self.workdir, f"worker{len(self.workers) + 1}",
                   ["--address", self.broker.address,
                    "--queues", ",".join(queues or [self.queue]), *args])
        self.workers.append(w)
        return w

    def close(self) -> None:
        for w in self.workers:
            w.kill()
        if self.secured is not None:
            self.secured.stop()


def result_of(job: job_pb2.Job) -> Any:
    try:
        return json.loads(job.result.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ScenarioFailed(f"job {job.id}'s result is not UTF-8 JSON: {job.result!r}") \
            from None


def ok_result(queue: str, echo: Any = None) -> dict[str, Any]:
    return {"queue": queue, "echo": echo}


# --- scenarios ----------------------------------------------------------------------------------
# Each gets a Run, raises ScenarioFailed on the first check that does not hold, and ends with
# the graceful stop of its workers.


def per_queue_handlers(r: Run) -> None:
    queues = [r.queue + ".a", r.queue + ".b"]
    w = r.worker(queues=queues)
    ids = {q: r.broker.enqueue(q, {"action": "ok", "echo": q[-1]}) for q in queues}
    for q, job_id in ids.items():
        job = r.broker.wait_state(job_id, COMPLETED)
        got = result_of(job)
        check(got == ok_result(q, q[-1]), f"result of {q}'s job is {got}, want {ok_result(q, q[-1])}")
        start = w.wait_event("start", job_id)
        check(start.get("handler") == q and start.get("queue") == q,
              f"{q}'s job ran in the handler of {start.get('handler')!r} "
              f"(queue {start.get('queue')!r})")
    check(len(w.events("ready")) == 1, "want one 'ready' event")
    w.stop_gracefully()


def lost_lease(r: Run) -> None:
    w = r.worker("--lease-ms", "1000")
    job_id = r.broker.enqueue(r.queue, {"action": "wait_cancel", "ok_from_attempt": 2})
    w.wait_event("start", job_id)
    os.kill(w.proc.pid, signal.SIGSTOP)
    try:
        # Frozen, the worker cannot heartbeat: the broker ends attempt 1 when its lease runs out.
        r.broker.wait_job(job_id, "past attempt 1's lease expiry",
                          lambda j: len(j.attempts) >= 1 and j.attempts[0].outcome
                          == job_pb2.ATTEMPT_OUTCOME_LEASE_EXPIRED)
    finally:
        os.kill(w.proc.pid, signal.SIGCONT)
    w.wait_event("cancelled", job_id, lambda e: e.get("attempt") == 1)
    job = r.broker.wait_state(job_id, COMPLETED)
    check(job.attempt == 2, f"completed by attempt {job.attempt}, want 2")
    check(result_of(job) == ok_result(r.queue), f"result {result_of(job)}")
    w.stop_gracefully()


def operator_cancel(r: Run) -> None:
    # A 60 s lease: only the helper's answer can end the attempt within the harness's bound.
    w = r.worker("--lease-ms", "60000")
    job_id = r.broker.enqueue(r.queue, {"action": "wait_cancel"})
    w.wait_event("start", job_id)
    r.broker.call(r.broker.admin.CancelJob, admin_pb2.CancelJobRequest(job_id=job_id))
    w.wait_event("cancelled", job_id)
    job = r.broker.wait_state(job_id, job_pb2.JOB_STATE_CANCELLED)
    check(job.attempt == 1, f"attempt {job.attempt}, want 1")
    # The slot is free again: the next job runs.
    next_id = r.broker.enqueue(r.queue, {"action": "ok"})
    r.broker.wait_state(next_id, COMPLETED)
    w.stop_gracefully()


def cancelled_work_finished(r: Run) -> None:
    # A handler that sees the cancel but returns normally did the work: the ack completes it.
    w = r.worker("--lease-ms", "60000")
    job_id = r.broker.enqueue(r.queue, {"action": "wait_cancel", "after_cancel": "return"})
    w.wait_event("start", job_id)
    r.broker.call(r.broker.admin.CancelJob, admin_pb2.CancelJobRequest(job_id=job_id))
    w.wait_event("cancelled", job_id)
    job = r.broker.wait_state(job_id, COMPLETED)
    check(result_of(job) == ok_result(r.queue), f"result {result_of(job)}")
    w.stop_gracefully()


def stuck_handler_keeps_slot(r: Run) -> None:
    # concurrency is a hard bound: a timed-out handler that ignores its cancellation keeps its
    # slot until it returns, so the next job starts only after it.
    w = r.worker("--concurrency", "1", "--lease-ms", "60000")
    stuck = r.broker.enqueue(r.queue, {"action": "ignore_cancel", "ms": 1500,
                                       "ok_from_attempt": 2}, timeout_ms=300)
    w.wait_event("start", stuck)
    after = r.broker.enqueue(r.queue, {"action": "ok"})
    r.broker.wait_state(after, COMPLETED)
    job = r.broker.wait_state(stuck, COMPLETED)
    check(job.attempts[0].outcome == job_pb2.ATTEMPT_OUTCOME_TIMED_OUT,
          f"attempt 1 ended {job_pb2.AttemptOutcome.Name(job.attempts[0].outcome)}, want "
          f"TIMED_OUT")
    order = [(e.get("event"), e.get("job"), e.get("attempt")) for e in w.events()
             if e.get("event") in ("start", "done")]
    stuck_done = order.index(("done", stuck, 1)) if ("done", stuck, 1) in order else None
    after_start = [i for i, e in enumerate(order) if e[:2] == ("start", after)]
    check(stuck_done is not None and after_start and after_start[0] > stuck_done,
          f"the next job started beside the stuck handler (concurrency 1): {order}")
    w.stop_gracefully()


def timeout(r: Run) -> None:
    w = r.worker("--lease-ms", "60000")
    job_id = r.broker.enqueue(r.queue, {"action": "wait_cancel", "ok_from_attempt": 2},
                              timeout_ms=1000)
    w.wait_event("cancelled", job_id, lambda e: e.get("attempt") == 1)
    job = r.broker.wait_state(job_id, COMPLETED)
    check(job.attempt == 2, f"completed by attempt {job.attempt}, want 2")
    outcome = job.attempts[0].outcome
    check(outcome == job_pb2.ATTEMPT_OUTCOME_TIMED_OUT,
          f"attempt 1 ended {job_pb2.AttemptOutcome.Name(outcome)}, want TIMED_OUT")
    w.stop_gracefully()


def graceful_stop(r: Run) -> None:
    w = r.worker("--concurrency", "1", "--prefetch", "1", "--lease-ms", "60000")
    gate = r.workdir / "gate"
    running = r.broker.enqueue(r.queue, {"action": "progress", "percent": 1, "gate": str(gate)})
    w.wait_event("start", running)
    held = r.broker.enqueue(r.queue, {"action": "ok"})
    r.broker.wait_state(held, job_pb2.JOB_STATE_ACTIVE)  # leased to the worker, waiting
    w.proc.send_signal(signal.SIGTERM)
    # Step 2 of the stop: what has not started goes back at once, while the running job runs.
    job = r.broker.wait_state(held, job_pb2.JOB_STATE_READY)
    check(not w.events("done", running), "the running job ended before the held one was released")
    check(not w.events("start", held), "the held job was started after the stop")
    check(job.attempt <= 1, f"the released job spent attempts: {job.attempt}")
    gate.touch()  # step 3: the running handler finishes within the grace
    w.wait_stopped()
    r.broker.wait_state(running, COMPLETED)
    check(r.broker.job(held).state == job_pb2.JOB_STATE_READY, "the held job is not READY")


def grace_then_cancel(r: Run) -> None:
    w = r.worker("--grace-ms", "500", "--lease-ms", "60000")
    job_id = r.broker.enqueue(r.queue, {"action": "wait_cancel"})
    w.wait_event("start", job_id)
    w.proc.send_signal(signal.SIGTERM)
    w.wait_event("cancelled", job_id)
    w.wait_stopped()
    # Released, not failed: the stop was not the job's fault.
    job = r.broker.wait_state(job_id, job_pb2.JOB_STATE_READY)
    check(not job.last_error, f"the stop failed the attempt: {job.last_error!r}")


def permanent(r: Run) -> None:
    w = r.worker()
    job_id = r.broker.enqueue(r.queue, {"action": "permanent", "message": "no such mailbox"})
    job = r.broker.wait_state(job_id, job_pb2.JOB_STATE_FAILED)
    check(job.fail_reason == job_pb2.FAIL_REASON_PERMANENT,
          f"fail reason {job_pb2.FailReason.Name(job.fail_reason)}, want PERMANENT")
    check(job.attempt == 1, f"{job.attempt} attempts, want 1 (max 5)")
    check("no such mailbox" in job.last_error, f"last error {job.last_error!r}")
    w.stop_gracefully()


def retry_after(r: Run) -> None:
    w = r.worker()
    job_id = r.broker.enqueue(r.queue, {"action": "retry_after", "ms": 1500, "message": "429"})
    job = r.broker.wait_state(job_id, COMPLETED)
    check(job.attempt == 2, f"completed by attempt {job.attempt}, want 2")
    first, second = job.attempts[0], job.attempts[1]
    waited = ts(second.started_at) - ts(first.ended_at)
    # The queue's backoff is 100 ms: only the handler's 1.5 s can explain a longer wait.
    check(waited >= 1.4, f"attempt 2 started {waited:.3f} s after attempt 1 ended, want >= 1.5 s")
    check("429" in first.error, f"attempt 1's error {first.error!r}")
    w.stop_gracefully()


def snooze(r: Run) -> None:
    w = r.worker()
    job_id = r.broker.enqueue(r.queue, {"action": "snooze", "ms": 1000})
    job = r.broker.wait_state(job_id, COMPLETED)
    check(job.snoozes == 1, f"snoozes = {job.snoozes}, want 1")
    starts = w.events("start", job_id)
    check([s.get("attempt") for s in starts] == [1, 1],
          f"attempts of the starts {[s.get('attempt') for s in starts]}, want [1, 1]")
    w.stop_gracefully()


def reconnect(r: Run) -> None:
    w = r.worker("--lease-ms", "10000")
    gate = r.workdir / "gate"
    first = r.broker.enqueue(r.queue, {"action": "progress", "percent": 1, "gate": str(gate)})
    w.wait_event("start", first)
    r.broker.kill9()
    gate.touch()  # the handler returns while the broker is down: its ack must wait
    w.wait_event("done", first)
    time.sleep(0.3)  # a few failed reconnects: the backoff must not give up
    r.broker.start()
    job = r.broker.wait_state(first, COMPLETED)
    check(job.attempt == 1, f"completed by attempt {job.attempt}, want 1 (the ack was not resent)")
    second = r.broker.enqueue(r.queue, {"action": "ok"})
    r.broker.wait_state(second, COMPLETED)
    w.stop_gracefully()


def steps(r: Run) -> None:
    job_id = r.broker.enqueue(r.queue, {"action": "steps", "steps": ["a", "b", "c"]})
    dying = r.worker("--lease-ms", "1000", "--die-at-step", "c")
    code = dying.wait_exit()
    check(code == -signal.SIGKILL, f"worker 1 should die by SIGKILL in step c, exit {code}"
          f"\n{dying.tail()}")
    w = r.worker("--lease-ms", "1000")
    job = r.broker.wait_state(job_id, COMPLETED)
    ran = [e.get("step") for e in dying.events("step", job_id) + w.events("step", job_id)]
    check(ran == ["a", "b", "c", "c"], f"step bodies ran {ran}, want a, b, c, c")
    want = {s: {"by": r.lang, "step": s} for s in ("a", "b", "c")}
    check(result_of(job) == want, f"result {result_of(job)}, want {want}")
    check(job.attempt == 2, f"completed by attempt {job.attempt}, want 2")
    w.stop_gracefully()


def progress(r: Run) -> None:
    w = r.worker()
    gate = r.workdir / "gate"
    job_id = r.broker.enqueue(r.queue, {"action": "progress", "percent": 50, "gate": str(gate)})
    seen: list[job_pb2.Job] = []
    call = r.broker.admin.WatchJob(admin_pb2.WatchJobRequest(job_id=job_id), timeout=GIVE_UP)

    def watch() -> None:
        with contextlib.suppress(grpc.RpcError):
            for job in call:
                seen.append(job)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        deadline = time.monotonic() + GIVE_UP
        while not any(j.progress and json.loads(j.progress) == {"percent": 50} for j in seen):
            check(time.monotonic() < deadline,
                  f"WatchJob never showed progress {{\"percent\": 50}}: saw "
                  f"{[j.progress for j in seen]}\n{w.tail()}")
            time.sleep(POLL)
        gate.touch()
        r.broker.wait_state(job_id, COMPLETED)
    finally:
        call.cancel()
        watcher.join()
    w.stop_gracefully()


def seed_kill(r: Run) -> None:
    users = [f"user_{i}" for i in range(1, 21)]
    for idempotent in (False, True):
        kind = "keyed" if idempotent else "plain"
        queue = f"{r.queue}.{kind}"
        outbox = r.workdir / f"{kind}.outbox"
        outbox.touch()
        extra = ["--idempotent"] if idempotent else []
        # A 3 s lease: user_6's comes back soon after the kill, and a worker starved of CPU
        # for a second (a JVM starting on a loaded machine) still heartbeats in time; with 1 s,
        # Java's first attempts expired under load and user_2 was emailed twice.
        args = ["--lease-ms", "3000", "--concurrency", "1", "--outbox", str(outbox), *extra]
        ids = [r.broker.enqueue(queue, {"action": "signup", "user": u}) for u in users]
        dying = r.worker(*args, "--die-after-user", "user_6", queues=[queue])
        code = dying.wait_exit()
        check(code == -signal.SIGKILL, f"{kind}: worker 1 should die after user_6, exit {code}"
              f"\n{dying.tail()}")
        w = r.worker(*args, queues=[queue])
        for job_id in ids:
            r.broker.wait_state(job_id, COMPLETED)
        w.stop_gracefully()
        sent = [json.loads(line)["user"] for line in outbox.read_text().splitlines() if line]
        missed = [u for u in users if u not in sent]
        twice = sorted({u for u in sent if sent.count(u) > 1})
        check(not missed, f"{kind}: never emailed {missed}")
        want_twice = [] if idempotent else ["user_6"]
        check(twice == want_twice and len(sent) == 20 + len(want_twice),
              f"{kind}: {len(sent)} emails, twice {twice}; want {20 + len(want_twice)}, twice "
              f"{want_twice}")


def identifies(r: Run) -> None:
    w = r.worker()
    w.wait_event("ready")
    deadline = time.monotonic() + GIVE_UP
    while True:
        workers = r.broker.call(r.broker.admin.ListWorkers, admin_pb2.ListWorkersRequest()).workers
        mine = [x for x in workers if r.queue in x.queues and x.streams > 0]
        if mine:
            break
        check(time.monotonic() < deadline, f"ListWorkers never showed a stream on {r.queue}")
        time.sleep(POLL)
    client = mine[0].client
    check(client.startswith(f"jobbroker-{r.lang}/"),
          f"ListWorkers says client {client!r}, want 'jobbroker-{r.lang}/<version>'")
    w.stop_gracefully()


def secured(r: Run) -> Broker:
    """A second broker for this scenario: TLS, mutual TLS and tokens (Pki)."""
    broker = Broker(r.broker.binary, r.workdir, Pki(r.workdir / "pki"))
    r.secured = broker
    return broker


def tls_token(r: Run) -> None:
    broker = secured(r)
    assert broker.pki is not None
    w = Worker(r.lang, r.workdir, "secured-worker",
               ["--address", broker.address, "--queues", r.queue,
                *broker.pki.worker_flags(broker.pki.worker_token)])
    r.workers.append(w)
    job_id = broker.enqueue(r.queue, {"action": "ok", "echo": "over TLS"})
    job = broker.wait_state(job_id, COMPLETED)
    check(result_of(job) == ok_result(r.queue, "over TLS"), f"result {result_of(job)}")
    workers = broker.call(broker.admin.ListWorkers, admin_pb2.ListWorkersRequest()).workers
    check(any(r.queue in x.queues and x.client.startswith(f"jobbroker-{r.lang}/")
              for x in workers), f"ListWorkers shows {[(x.queues, x.client) for x in workers]}")
    w.stop_gracefully()


def bad_token_refused(r: Run) -> None:
    # UNAUTHENTICATED is the caller's mistake: the run call ends with it (no retrying forever).
    broker = secured(r)
    assert broker.pki is not None
    w = Worker(r.lang, r.workdir, "refused-worker",
               ["--address", broker.address, "--queues", r.queue,
                *broker.pki.worker_flags("not-a-token")])
    r.workers.append(w)
    job_id = broker.enqueue(r.queue, {"action": "ok"})
    code = w.wait_exit()
    check(code == 1, f"a refused token: exit {code}, want 1\n{w.tail()}")
    check(not w.events("start"), "a worker whose token was refused ran a job")
    check(broker.job(job_id).state == job_pb2.JOB_STATE_READY, "the job is not READY")


def cluster_leader_kill(r: Run) -> None:
    # Three nodes; the worker is given every address, the queue's leader first. Its leader dies
    # (kill -9) while jobs run and more arrive: the worker moves to another node, the new
    # leader serves the partition, and every acknowledged job completes.
    cluster = Cluster(r.broker.binary, r.workdir / "cluster")
    r.secured = cluster  # closed with the run
    first = [cluster.enqueue(r.queue, {"action": "sleep", "ms": 50}) for _ in range(30)]
    leader = cluster.leader_of(r.queue)
    order = [cluster.addresses[leader]] + [a for i, a in enumerate(cluster.addresses)
                                           if i != leader]
    w = Worker(r.lang, r.workdir, "cluster-worker",
               ["--address", ",".join(order), "--queues", r.queue, "--concurrency", "4",
                "--lease-ms", "2000"])
    r.workers.append(w)
    deadline = time.monotonic() + GIVE_UP
    while len(w.events("done")) < 10:
        check(time.monotonic() < deadline and w.proc.poll() is None,
              f"the worker did not get going on the cluster\n{w.tail()}")
        time.sleep(POLL)
    cluster.kill9(leader)
    later = [cluster.enqueue(r.queue, {"action": "sleep", "ms": 50}) for _ in range(20)]
    for job_id in first + later:
        cluster.wait_state(job_id, COMPLETED)
    check(cluster.leader_of(r.queue) != leader, "the dead node still leads the queue")
    w.stop_gracefully()


def partition_of(queue: str, count: int) -> int:
    """Where the broker places a queue: FNV-1a 64 of its name, modulo the partition count
    (tests/client/partition_vectors.tsv)."""
    h = 0xCBF29CE484222325
    for byte in queue.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h % count


def cluster_stream_per_leader(r: Run) -> None:
    # Two queues on partitions led by different nodes; the worker is given the node that leads
    # neither first. It opens a stream on each leader (no node relays one), and when one leader
    # dies (kill -9) it regroups onto the new leader without losing a job.
    cluster = Cluster(r.broker.binary, r.workdir / "cluster")
    r.secured = cluster  # closed with the run
    leaders = cluster.leaders()
    queues: dict[int, str] = {}  # partition -> a queue in it
    for i in range(64):
        queues.setdefault(partition_of(f"{r.queue}-{i}", len(leaders)), f"{r.queue}-{i}")
    check(len(queues) == len(leaders), "no queue name found for every partition")
    qa, qb = queues[0], queues[1]
    la, lb = leaders[0], leaders[1]
    neither = next(n for n in range(Cluster.NODES) if n not in (la, lb))
    order = [cluster.addresses[neither]] + [cluster.addresses[n] for n in (la, lb)]
    first = [cluster.enqueue(q, {"action": "sleep", "ms": 20}) for q in (qa, qb) for _ in range(10)]
    w = Worker(r.lang, r.workdir, "stream-per-leader-worker",
               ["--address", ",".join(order), "--queues", f"{qa},{qb}", "--concurrency", "4",
                "--lease-ms", "2000"])
    r.workers.append(w)
    for job_id in first:
        cluster.wait_state(job_id, COMPLETED)
    relaying = [cluster.metric(n, "jobbroker_work_streams_relaying") for n in range(Cluster.NODES)]
    opened = [cluster.metric(n, "jobbroker_work_streams_open") for n in range(Cluster.NODES)]
    check(relaying == [0, 0, 0],
          f"nodes relay the worker's streams (relaying per node {relaying}): it did not open "
          f"one stream per leader")
    check(opened[la] >= 1 and opened[lb] >= 1 and opened[neither] == 0,
          f"open streams per node {opened}: want one or more on node-{la} and node-{lb} (the "
          f"leaders), none on node-{neither}\n{w.tail()}")
    cluster.kill9(la)
    later = [cluster.enqueue(q, {"action": "sleep", "ms": 20}) for q in (qa, qb) for _ in range(10)]
    for job_id in later:
        cluster.wait_state(job_id, COMPLETED)
    # Regrouped: the queue of the dead leader is on its new leader's stream, relayed by none.
    alive = [n for n in range(Cluster.NODES) if n != la]
    deadline = time.monotonic() + GIVE_UP
    while any(cluster.metric(n, "jobbroker_work_streams_relaying") for n in alive):
        check(time.monotonic() < deadline,
              f"a node still relays the worker's stream {GIVE_UP:.0f} s after the leader's "
              f"death\n{w.tail()}")
        time.sleep(POLL)
    w.stop_gracefully()


SCENARIOS: dict[str, Callable[[Run], None]] = {
    f.__name__: f
    for f in (per_queue_handlers, lost_lease, operator_cancel, cancelled_work_finished, timeout,
              stuck_handler_keeps_slot, graceful_stop,
              grace_then_cancel, permanent, retry_after, snooze, reconnect, steps, progress,
              seed_kill, identifies, tls_token, bad_token_refused, cluster_leader_kill,
              cluster_stream_per_leader)
}


# --- the matrix ---------------------------------------------------------------------------------


def build(lang: str) -> str:
    script = HERE / lang / "build.sh"
    if not script.exists():
        return f"no {script.relative_to(REPO)}"
    done = subprocess.run([str(script)], capture_output=True, text=True)
    if done.returncode != 0:
        return f"build.sh exit {done.returncode}: {(done.stdout + done.stderr)[-2000:]}"
    return ""


def run_language(lang: str, scenarios: list[str], binary: str,
                 root: Path) -> Iterator[tuple[str, float, str]]:
    """Yields (scenario, seconds, problem or "") for each scenario."""
    workdir = root / lang
    workdir.mkdir()
    broker = Broker(binary, workdir)
    try:
        for name in scenarios:
            run = Run(lang, name, broker, workdir)
            started = time.monotonic()
            problem = ""
            try:
                SCENARIOS[name](run)
            except ScenarioFailed as err:
                problem = str(err)
            except Exception as err:  # a broken harness call is a failed cell, with its cause
                problem = f"{type(err).__name__}: {err}"
            finally:
                run.close()
            if broker.proc is None or broker.proc.poll() is not None:
                broker.start()  # a scenario that failed between kill9 and start
            yield name, time.monotonic() - started, problem
    finally:
        broker.stop()


def steps_across(first: str, second: str, broker: Broker, root: Path) -> str:
    """A job whose worker died in `first` is finished in `second`: the checkpoint format is one
    (StepCheckpoint, results as UTF-8 JSON), so the steps `first` saved are not run again and
    their results come back as `first` wrote them. Returns the problem, or ""."""
    run = Run(first, f"steps_{first}_to_{second}", broker, root)
    try:
        job_id = broker.enqueue(run.queue, {"action": "steps", "steps": ["a", "b", "c"]})
        dying = run.worker("--lease-ms", "1000", "--die-at-step", "c")
        code = dying.wait_exit()
        check(code == -signal.SIGKILL, f"{first} worker should die by SIGKILL in step c, exit "
              f"{code}\n{dying.tail()}")
        run.lang = second
        w = run.worker("--lease-ms", "1000")
        job = broker.wait_state(job_id, COMPLETED)
        ran = [(first, e.get("step")) for e in dying.events("step", job_id)] + \
            [(second, e.get("step")) for e in w.events("step", job_id)]
        want_ran = [(first, "a"), (first, "b"), (first, "c"), (second, "c")]
        check(ran == want_ran, f"step bodies ran {ran}, want {want_ran}")
        want = {"a": {"by": first, "step": "a"}, "b": {"by": first, "step": "b"},
                "c": {"by": second, "step": "c"}}
        check(result_of(job) == want, f"result {result_of(job)}, want {want}")
        w.stop_gracefully()
        return ""
    except ScenarioFailed as err:
        return str(err)
    finally:
        run.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lang", action="append", choices=LANGS)
    parser.add_argument("--scenario", action="append", choices=list(SCENARIOS))
    parser.add_argument("--all-pairs", action="store_true",
                        help="steps across every ordered pair of languages, not only the chain")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("CONFORMANCE_JOBS", "2")),
                        help="languages run at once, each with its own broker (default 2, or "
                             "$CONFORMANCE_JOBS)")
    args = parser.parse_args()
    langs = args.lang or LANGS
    scenarios = args.scenario or list(SCENARIOS)
    binary = os.environ.get("JOBBROKER_BIN") or str(REPO / "build/server/jobbroker")

    root = Path(tempfile.mkdtemp(prefix="conformance."))
    cells: dict[tuple[str, str], str] = {}
    problems: list[str] = []
    built: list[str] = []
    pairs: dict[tuple[str, str], str] = {}
    try:
        # Languages run side by side (--jobs), each with its own broker and folder: the cells
        # mostly wait (leases running out, back-offs, grace periods), so two at a time take
        # about half the time on two cores.
        lock = threading.Lock()

        def one_language(lang: str) -> None:
            failure = build(lang)
            if failure:
                with lock:
                    for name in scenarios:
                        cells[(lang, name)] = "FAIL"
                    problems.append(f"--- {lang}: every scenario\n{failure}")
                return
            with lock:
                built.append(lang)
            for name, took, problem in run_language(lang, scenarios, binary, root):
                with lock:
                    cells[(lang, name)] = "FAIL" if problem else "pass"
                    print(f"{lang:<11} {name:<20} {'FAIL' if problem else 'pass'} {took:5.1f} s",
                          flush=True)
                    if problem:
                        problems.append(f"--- {lang} / {name}\n{problem}")

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
            for done in [pool.submit(one_language, lang) for lang in langs]:
                done.result()
        built.sort(key=langs.index)  # the chain's order, whichever finished first
        # Durable steps across languages: the chain (each language once first, once second), or
        # every ordered pair. Only with the whole scenario list: a --scenario run is a focus.
        if not args.scenario and len(built) >= 2:
            if args.all_pairs:
                order = [(a, b) for a in built for b in built if a != b]
            else:
                order = list(zip(built, built[1:] + built[:1]))
            workdir = root / "across"
            workdir.mkdir()
            broker = Broker(binary, workdir)
            try:
                for first, second in order:
                    problem = steps_across(first, second, broker, workdir)
                    pairs[(first, second)] = problem
                    print(f"steps {first} -> {second}: {'FAIL' if problem else 'pass'}",
                          flush=True)
                    if problem:
                        problems.append(f"--- steps {first} -> {second}\n{problem}")
            finally:
                broker.stop()
    finally:
        if args.keep or problems:
            print(f"scratch (logs, events): {root}")
        else:
            import shutil

            shutil.rmtree(root, ignore_errors=True)

    width = max(len(s) for s in scenarios)
    print()
    print(" " * width + "".join(f" {lang:>10}" for lang in langs))
    for name in scenarios:
        print(f"{name:<{width}}" + "".join(f" {cells.get((lang, name), 'MISSING'):>10}"
                                           for lang in langs))
    failed = sum(1 for c in cells.values() if c != "pass")
    missing = len(langs) * len(scenarios) - len(cells)
    pairs_failed = sum(1 for p in pairs.values() if p)
    for p in problems:
        print(p)
    print(f"conformance: {len(cells) - failed} passed, {failed + missing} failed "
          f"({len(langs)} languages x {len(scenarios)} scenarios); steps across languages: "
          f"{len(pairs) - pairs_failed} of {len(pairs)} pairs passed")
    return 0 if failed + missing + pairs_failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
