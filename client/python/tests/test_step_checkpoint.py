"""The rules for reading a durable-steps checkpoint, which every language's helper shares
(steps.proto). Pure: no broker needed."""

from __future__ import annotations

import pytest

from jobbroker.v1 import steps_pb2
from jobbroker.worker import _load_step_checkpoint


def encode(*steps: tuple[str, bytes]) -> bytes:
    cp = steps_pb2.StepCheckpoint()
    for name, result in steps:
        cp.steps.add(name=name, result=result)
    return cp.SerializeToString()


VALID = encode(("a", b'{"n":1}'), ("b", b"null"))
# Field 9 as a varint: a field StepCheckpoint does not have yet, as a newer helper might add.
NEWER = VALID + bytes([9 << 3, 1])


@pytest.mark.parametrize(
    ("data", "steps"),
    [(b"", []), (VALID, ["a", "b"]), (NEWER, ["a", "b"])],
    ids=["empty", "valid", "unknown field from a newer helper"],
)
def test_checkpoints_of_durable_steps_are_read(data: bytes, steps: list[str]) -> None:
    results: dict[str, bytes] = {}
    assert _load_step_checkpoint(data, steps_pb2.StepCheckpoint(), results) == ""
    assert list(results) == steps


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\xff\xff\xff", "Error"),
        (b"\x08\x01", "holds no step"),
        (b"\x0a\x00", "bad or repeated step name ''"),
        (encode(("a", b"1"), ("a", b"2")), "bad or repeated step name 'a'"),
        (encode(("a", b"{")), "step 'a' has a result that is not JSON"),
    ],
    ids=["not protobuf", "only a foreign field", "empty name", "repeated name", "not JSON"],
)
def test_other_checkpoints_are_refused_with_the_reason(data: bytes, why: str) -> None:
    assert why in _load_step_checkpoint(data, steps_pb2.StepCheckpoint(), {})
