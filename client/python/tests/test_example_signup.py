"""Runs examples/python/signup/kill_test.py and checks the table it prints."""

from __future__ import annotations

import os
import subprocess
import sys

from brokerproc import REPO_ROOT, broker_binary


def test_signup_kill_test_table() -> None:
    script = REPO_ROOT / "examples" / "python" / "signup" / "kill_test.py"
    env = dict(os.environ, JOBBROKER_BIN=broker_binary())
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=600, env=env, cwd=script.parent)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {}
    for line in run.stdout.splitlines():
        parts = line.rsplit(None, 2)
        if len(parts) == 3 and parts[1].isdigit():
            rows[parts[0].strip()] = (int(parts[1]), int(parts[2]))
    assert rows == {
        "users emailed": (20, 20),
        "never emailed": (0, 0),
        "duplicate emails": (1, 0),
    }, run.stdout
