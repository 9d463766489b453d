"""Starts the real jobbroker binary for tests (no mocks), on ports the OS picks."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from typing import Any

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]
_READY = re.compile(r"jobbroker: serving grpc=(\S+) http=(\S+)")


def broker_binary() -> str:
    return os.environ.get("JOBBROKER_BIN") or str(REPO_ROOT / "build" / "server" / "jobbroker")


class BrokerProcess:
    """One broker with a fresh data directory. Use as a context manager; stop() sends SIGTERM."""

    def __init__(self, config: dict[str, Any] | None = None, *, data_dir: str | None = None,
                 listen: str = "127.0.0.1:0", extra_args: list[str] | None = None) -> None:
        self._own_dir = data_dir is None
        self.dir = data_dir or tempfile.mkdtemp(prefix="jobbroker-py-")
        self.config = config
        self.listen = listen
        self.extra_args = list(extra_args or [])
        self.address = ""
        # The HTTP listener (/metrics, /healthz), host:port.
        self.http_address = ""
        self.proc: subprocess.Popen[str] | None = None
        self.log_lines: list[str] = []

    def start(self) -> BrokerProcess:
        args = [broker_binary(), "--listen", self.listen, "--http-listen", "127.0.0.1:0",
                "--data-dir", os.path.join(self.dir, "data"), "--log-level", "warn"]
        if self.config is not None:
            path = os.path.join(self.dir, "config.json")
            with open(path, "w") as f:
                json.dump(self.config, f)
            args += ["--config", path]
        args += self.extra_args
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        ready = threading.Event()

        def drain() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:  # keeps the pipe from filling
                self.log_lines.append(line.rstrip())
                m = _READY.search(line)
                if m and not ready.is_set():
                    self.address = m.group(1)
                    self.http_address = m.group(2)
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(30) or not self.address:
            self.kill()
            raise RuntimeError("the broker did not start:\n" + "\n".join(self.log_lines))
        return self

    def stop(self) -> int:
        """SIGTERM, then waits; the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def cleanup(self) -> None:
        self.kill()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.cleanup()
