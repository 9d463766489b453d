"""Every Python snippet of README.md runs against the real broker."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys

from brokerproc import BrokerProcess
from conftest import wait_state

import jobbroker

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_every_snippet_compiles() -> None:
    blocks = snippets()
    assert len(blocks) == 12
    for i, block in enumerate(blocks):
        compile(block, f"README.md block {i}", "exec")


def test_first_screen_is_the_examples() -> None:
    """The producer and the worker at the top are examples/ verbatim (test_install.py runs them
    from an installed wheel)."""
    examples = README.parent / "examples"
    assert snippets()[:2] == [(examples / "producer.py").read_text(),
                              (examples / "worker.py").read_text()]


async def test_the_snippets_run(tmp_path: pathlib.Path, broker: BrokerProcess,
                                client: jobbroker.Client) -> None:
    (enqueue, coalescing, connecting, sync, worker, typed, errors, steps, middleware,
     tracing) = snippets()[2:]
    del connecting  # TLS to made-up hosts: compiled above, not run
    del typed  # compiled above; tests/test_typed_payloads.py runs typed handlers
    env = dict(os.environ, JOBBROKER_ADDRESS=broker.address)

    def run(code: str) -> str:
        return subprocess.run([sys.executable, "-c", code], env=env, check=True,
                              capture_output=True, text=True, timeout=120).stdout

    assert run(enqueue).splitlines()[-1] == "JOB_STATE_READY"
    assert run(coalescing).splitlines()[-1] == "1000 True"
    assert "StatusCode.INVALID_ARGUMENT" in run(errors)
    run(middleware)  # registers and exits: no call is made
    run(tracing)

    for code, queue, expected in ((worker, "emails", {"status": "sent"}),
                                  (steps, "orders", {"charge": "ch_123",
                                                     "parcel": {"parcel": "p_9"}})):
        job = await client.enqueue(queue, "x")
        proc = subprocess.Popen([sys.executable, "-c", code], env=env,
                                stdout=subprocess.DEVNULL)
        try:
            done = await wait_state(client, job.job_id, jobbroker.JOB_STATE_COMPLETED)
            if queue == "emails":  # the SyncClient snippet waits for a job this worker does
                assert run(sync).splitlines()[-1] == "JOB_STATE_COMPLETED {'status': 'sent'}"
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
        assert json.loads(done.result) == expected
