"""A fake email provider: "sending" appends one line per email to an outbox file.

flock keeps two worker processes from interleaving, as a real provider's own consistency would.
When asked to honour idempotency keys, it skips a key it has already seen (like the
Idempotency-Key header of real email and payment APIs).
"""

from __future__ import annotations

import fcntl
import os


def send_welcome_email(outbox: str, user: str, idempotency_key: str, honour_key: bool) -> bool:
    """Appends "<user> key=<key>" to `outbox`; False if skipped as a repeat."""
    fd = os.open(outbox, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        tag = f" key={idempotency_key}\n"
        if honour_key:
            seen = b""
            os.lseek(fd, 0, os.SEEK_SET)
            while chunk := os.read(fd, 65536):
                seen += chunk
            if any(line.endswith(tag) for line in seen.decode().splitlines(keepends=True)):
                return False
        os.write(fd, (user + tag).encode())
        os.fsync(fd)
        return True
    finally:
        os.close(fd)  # also drops the lock


def emails_per_user(outbox: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    if os.path.exists(outbox):
        with open(outbox) as f:
            for line in f:
                user = line.split(" ", 1)[0]
                counts[user] = counts.get(user, 0) + 1
    return counts
