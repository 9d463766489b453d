"""The packages a user installs: the wheel and the sdist that test.sh built ($JOBBROKER_PY_DIST),
their contents, the wheel the sdist rebuilds, and the wheel installed into a brand-new venv (with
its pinned run-time dependencies, from requirements-runtime.txt, downloaded by test.sh into
$JOBBROKER_PY_WHEELHOUSE) running examples/worker.py and examples/producer.py against the real
broker with TLS and bearer tokens. Nothing of the source tree is on that venv's import path."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from importlib.metadata import distribution
from typing import Any

import pytest
from brokerproc import REPO_ROOT, BrokerProcess, broker_binary
from conftest import CONFIG, eventually
from pki import TestPki

import jobbroker

HERE = pathlib.Path(__file__).resolve().parents[1]  # client/python
VERSION = (REPO_ROOT / "VERSION").read_text().strip()
DIST = os.environ.get("JOBBROKER_PY_DIST", "")
WHEELHOUSE = os.environ.get("JOBBROKER_PY_WHEELHOUSE", "")

pytestmark = pytest.mark.skipif(
    not DIST or not WHEELHOUSE,
    reason="needs the packages and the wheelhouse that test.sh makes (run client/python/test.sh)")

WORKER_TOKEN, PRODUCER_TOKEN = "install-test-worker-token", "install-test-producer-token"


def wheel_path() -> pathlib.Path:
    (wheel,) = pathlib.Path(DIST).glob("jobbroker-*.whl")
    return wheel


def sdist_path() -> pathlib.Path:
    (sdist,) = pathlib.Path(DIST).glob("jobbroker-*.tar.gz")
    return sdist


def unpack_wheel(wheel: pathlib.Path, into: pathlib.Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as z:
        z.extractall(into)
        return {name: z.read(name) for name in z.namelist()}


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", *args],
                   check=True, timeout=300)


def test_version_comes_from_the_repository_version_file() -> None:
    assert wheel_path().name == f"jobbroker-{VERSION}-py3-none-any.whl"
    assert sdist_path().name == f"jobbroker-{VERSION}.tar.gz"
    # The package test.sh installed into its venv, and the "jobbroker-client" call metadata.
    assert jobbroker.__version__ == VERSION
    assert distribution("jobbroker").version == VERSION
    assert jobbroker._metadata.CLIENT_NAME == f"jobbroker-python/{VERSION}"


def test_wheel_contents() -> None:
    with zipfile.ZipFile(wheel_path()) as z:
        names = set(z.namelist())
        info = f"jobbroker-{VERSION}.dist-info"
        metadata = z.read(f"{info}/METADATA").decode()
        assert z.read(f"{info}/licenses/LICENSE") == (REPO_ROOT / "LICENSE").read_bytes()
        assert z.read("jobbroker/_version.py").decode().endswith(f'__version__ = "{VERSION}"\n')
    headers = metadata.split("\n\n", 1)[0].splitlines()
    for header in (f"Version: {VERSION}", "License-Expression: Apache-2.0", "License-File: LICENSE",
                   "Requires-Python: >=3.11", "Requires-Dist: grpcio<2,>=1.85.1",
                   "Requires-Dist: protobuf<8,>=7.35.1",
                   "Requires-Dist: opentelemetry-api<2,>=1.30; extra == 'tracing'"):
        assert header in headers
    for module in ("admin", "broker", "job", "policy", "steps"):
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            assert f"jobbroker/v1/{module}{suffix}" in names
    assert {"jobbroker/py.typed", "jobbroker/__init__.py", "jobbroker/tracing.py"} <= names
    # Only the package and its metadata: no tests, examples or build hook.
    assert {n.split("/")[0] for n in names} == {"jobbroker", info}


def test_sdist_contents_and_the_wheel_it_rebuilds(tmp_path: pathlib.Path) -> None:
    top = f"jobbroker-{VERSION}"
    with tarfile.open(sdist_path()) as tar:
        names = set(tar.getnames())
        tar.extractall(tmp_path / "sdist", filter="data")
    for name in ("PKG-INFO", "LICENSE", "pyproject.toml", "hatch_build.py", "README.md",
                 "src/jobbroker/_version.py", "src/jobbroker/v1/broker_pb2.py",
                 "src/jobbroker/v1/broker_pb2_grpc.py", "examples/worker.py"):
        assert f"{top}/{name}" in names
    assert (tmp_path / "sdist" / top / "LICENSE").read_bytes() == \
        (REPO_ROOT / "LICENSE").read_bytes()
    # A wheel built from the sdist alone (no proto folder, no VERSION file, no grpcio-tools
    # needed) has exactly the files, byte for byte, of the wheel built from the checkout.
    pip("wheel", "--no-build-isolation", "--no-index", "--no-deps", "--wheel-dir",
        str(tmp_path / "rebuilt"), str(tmp_path / "sdist" / top))
    (rebuilt,) = (tmp_path / "rebuilt").glob("*.whl")
    assert rebuilt.name == wheel_path().name
    assert unpack_wheel(rebuilt, tmp_path / "a") == unpack_wheel(wheel_path(), tmp_path / "b")


def lock_blocks(text: str) -> dict[str, str]:
    """name -> its pin and hash lines, from a pip-compile lock file."""
    blocks = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\\n((?:    --hash=\S+(?: \\)?\n)+)", text, re.M)
    return {name.lower(): f"{version}\n{hashes}" for name, version, hashes in blocks}


def runtime_closure() -> set[str]:
    """The installed package's run-time requirements (no extras), and theirs."""
    seen: set[str] = set()
    todo = ["jobbroker"]
    while todo:
        dist = distribution(todo.pop())
        for req in dist.requires or []:
            if "extra ==" in req:
                continue
            name = re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower().replace("_", "-")
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


def test_runtime_lock_matches_the_dev_lock() -> None:
    runtime = lock_blocks((HERE / "requirements-runtime.txt").read_text())
    dev = lock_blocks((HERE / "requirements-dev.txt").read_text())
    assert set(runtime) == runtime_closure()
    for name, block in runtime.items():
        assert dev[name] == block, f"{name}: requirements-runtime.txt and requirements-dev.txt differ"


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A brand-new venv with the wheel and its pinned dependencies, from local files only."""
    root = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = str(root / "bin" / "python")
    pip("--python", python, "install", "--no-index", "--find-links", WHEELHOUSE,
        "--require-hashes", "-r", str(HERE / "requirements-runtime.txt"))
    # By name and version, from the folder of the built packages: pip resolves the wheel's
    # dependencies against what the lock installed.
    pip("--python", python, "install", "--no-index", "--find-links", DIST,
        "--find-links", WHEELHOUSE, f"jobbroker=={VERSION}")
    pip("--python", python, "check")
    return root


@pytest.fixture(scope="module")
def secured_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess,
                                                                                TestPki]]:
    """TLS with a throwaway CA (server certificate for IP 127.0.0.1) and bearer tokens."""
    pki = TestPki(tmp_path_factory.mktemp("pki"))
    tokens = pki.folder / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [
        {"name": "workers", "sha256": hashlib.sha256(WORKER_TOKEN.encode()).hexdigest(),
         "roles": ["worker"], "queues": ["emails"]},
        {"name": "producer", "sha256": hashlib.sha256(PRODUCER_TOKEN.encode()).hexdigest(),
         "roles": ["producer", "admin"], "queues": ["*"]},
    ]}))
    flags = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
             "--auth-tokens", str(tokens)]
    with BrokerProcess(CONFIG, extra_args=flags) as broker:
        yield broker, pki


def user_env(broker: BrokerProcess, pki: TestPki, token: str) -> dict[str, str]:
    """A user's environment: the connection settings, and no Python path of ours."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "JOBBROKER_"))}
    env.update(JOBBROKER_ADDRESS=broker.address, JOBBROKER_CA=str(pki.ca),
               JOBBROKER_TOKEN=token, PYTHONUNBUFFERED="1")
    return env


async def test_installed_example_worker_with_tls_and_token(
        venv: pathlib.Path, secured_broker: tuple[BrokerProcess, TestPki],
        tmp_path: pathlib.Path) -> None:
    broker, pki = secured_broker
    project = tmp_path / "project"  # the user's project: the two examples, copied
    project.mkdir()
    for name in ("worker.py", "producer.py"):
        shutil.copy(HERE / "examples" / name, project / name)
    python = str(venv / "bin" / "python")

    # The proof: `import jobbroker` in that venv, run the way the examples run, finds the
    # installed wheel, and nothing on sys.path is in this checkout.
    probe = subprocess.run(
        [python, "-c", "import json, sys, jobbroker; "
                       "print(json.dumps([jobbroker.__file__, jobbroker.__version__, sys.path]))"],
        cwd=project, env=user_env(broker, pki, WORKER_TOKEN), check=True, capture_output=True,
        text=True, timeout=60)
    module_file, version, path = json.loads(probe.stdout)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert module_file == str(site / "jobbroker" / "__init__.py")
    assert version == VERSION
    assert not [p for p in path if p.startswith(str(REPO_ROOT))], path

    worker = subprocess.Popen([python, "worker.py"], cwd=project, text=True,
                              env=user_env(broker, pki, WORKER_TOKEN),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        options = jobbroker.ClientOptions(address=broker.address, tls=str(pki.ca),
                                          token=PRODUCER_TOKEN)
        async with jobbroker.Client(options=options) as admin:
            async def registered() -> bool:
                workers: Any = await admin.list_workers()
                return any(w.client == f"jobbroker-python/{VERSION}" for w in workers)
            await eventually(registered, 60, "the example worker in ListWorkers")

        produced = subprocess.run([python, "producer.py", "ada@example.com", "Ada"], cwd=project,
                                  env=user_env(broker, pki, PRODUCER_TOKEN), capture_output=True,
                                  text=True, timeout=120)
        assert produced.returncode == 0, produced.stdout + produced.stderr
        _, state, result = produced.stdout.split(None, 2)
        assert (state, result.strip()) == ("JOB_STATE_COMPLETED", "{'status': 'sent'}")
    finally:
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, out
    assert "to=ada@example.com " in out and "Welcome, Ada!" in out, out


def test_installed_example_worker_through_a_leader_kill_in_a_cluster(
        venv: pathlib.Path, tmp_path: pathlib.Path) -> None:
    # The same worker.py, from the same venv, given a 3-node cluster's addresses in
    # $JOBBROKER_ADDRESS: tests/lib/cluster_example.sh enqueues 30 sign-ups, kill -9s the leader
    # of the queue's partition once the first is done, enqueues 20 more, and passes when all 50
    # completed and the worker stopped cleanly on SIGTERM.
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(HERE / "examples" / "worker.py", project / "worker.py")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "JOBBROKER_"))}
    env["PYTHONUNBUFFERED"] = "1"
    done = subprocess.run(
        [str(REPO_ROOT / "tests" / "lib" / "cluster_example.sh"), broker_binary(),
         str(tmp_path / "run"),
         "emails", '{"email": "c{n}@example.com", "name": "C{n}"}', "--",
         str(venv / "bin" / "python"), "worker.py"],
        cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all 50 jobs completed" in done.stdout, done.stdout
