"""Typed payloads: a handler's second parameter declares the payload's type (a dataclass, a
TypedDict, a pydantic model, a JSON type); JobContext.data_as does the same on demand."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal, NotRequired, TypedDict

import pytest
from brokerproc import BrokerProcess
from conftest import running_worker, wait_state

import jobbroker
from jobbroker._typed import decode_payload


@dataclasses.dataclass
class Address:
    city: str
    zip: str = ""


@dataclasses.dataclass
class Signup:
    email: str
    name: str
    addresses: list[Address] = dataclasses.field(default_factory=list)
    plan: Literal["free", "pro"] = "free"
    referrer: str | None = None


class Invoice(TypedDict):
    invoice: int
    amount: float
    note: NotRequired[str]


class FakeModel:
    """Stands for a pydantic v2 model (pydantic is optional: not installed for these tests):
    what the worker calls is model_validate_json."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    @classmethod
    def model_validate_json(cls, raw: bytes) -> FakeModel:
        data = json.loads(raw)
        if "id" not in data:
            raise ValueError("1 validation error for FakeModel\nid: Field required")
        return cls(data)


def test_dataclass_nested_with_defaults_and_unknown_keys() -> None:
    raw = json.dumps({"email": "ada@example.com", "name": "Ada", "plan": "pro",
                      "addresses": [{"city": "London"}], "added_later": 1}).encode()
    assert decode_payload(raw, Signup) == Signup("ada@example.com", "Ada",
                                                 [Address("London")], "pro", None)


@pytest.mark.parametrize("payload, message", [
    ({"name": "Ada"}, "Signup needs email"),
    ({"email": 1, "name": "Ada"}, "^email: a number where str was expected"),
    ({"email": "a@b", "name": "Ada", "plan": "gold"}, "'gold' is not one of"),
    ({"email": "a@b", "name": "Ada", "addresses": [{"zip": "1"}]},
     r"^addresses\[0\]: Address needs city"),
    ([1], "a JSON object for Signup, not an array"),
])
def test_dataclass_mismatch(payload: Any, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        decode_payload(json.dumps(payload).encode(), Signup)


def test_typeddict_and_json_types() -> None:
    assert decode_payload(b'{"invoice": 42, "amount": 10}', Invoice) == {"invoice": 42,
                                                                        "amount": 10.0}
    with pytest.raises(TypeError, match="Invoice needs amount"):
        decode_payload(b'{"invoice": 42}', Invoice)
    assert decode_payload(b"[1, 2]", list[int]) == [1, 2]
    assert decode_payload(b'{"a": [true]}', dict[str, list[bool]]) == {"a": [True]}
    with pytest.raises(TypeError):
        decode_payload(b"[1, true]", list[int])
    with pytest.raises(ValueError):
        decode_payload(b"not json", Invoice)


def test_pydantic_style_model() -> None:
    model = decode_payload(b'{"id": 7}', FakeModel)
    assert isinstance(model, FakeModel) and model.data == {"id": 7}
    with pytest.raises(ValueError, match="Field required"):
        decode_payload(b"{}", FakeModel)


async def test_typed_handlers_against_the_broker(broker: BrokerProcess,
                                                client: jobbroker.Client) -> None:
    seen: list[Any] = []
    worker = jobbroker.Worker(broker.address, concurrency=2, handle_signals=False)

    @worker.handler("typed.signups")
    async def signup(job: jobbroker.JobContext, data: Signup) -> dict[str, str]:
        seen.append(data)
        assert job.data_as(Signup) == data
        return {"hello": data.name}

    @worker.handler("typed.invoices")
    def invoice(job: jobbroker.JobContext, data: Invoice) -> float:  # a plain function, threaded
        seen.append(data)
        return data["amount"] * 2

    good = await client.enqueue("typed.signups", {"email": "ada@example.com", "name": "Ada"})
    bad = await client.enqueue("typed.signups", {"name": "no email"}, max_attempts=5)
    inv = await client.enqueue("typed.invoices", {"invoice": 1, "amount": 2.5})
    async with running_worker(worker):
        done = await wait_state(client, good.job_id, jobbroker.JOB_STATE_COMPLETED)
        failed = await wait_state(client, bad.job_id, jobbroker.JOB_STATE_FAILED)
        paid = await wait_state(client, inv.job_id, jobbroker.JOB_STATE_COMPLETED)
    assert json.loads(done.result) == {"hello": "Ada"}
    assert json.loads(paid.result) == 5.0
    # A payload that does not fit is not retried: no attempt could fix it.
    assert failed.fail_reason == jobbroker.FAIL_REASON_PERMANENT and failed.attempt == 1
    assert "invalid payload: Signup needs email" in failed.last_error
    assert len(seen) == 2  # the bad payload never reached the handler
    assert Signup("ada@example.com", "Ada") in seen and {"invoice": 1, "amount": 2.5} in seen
