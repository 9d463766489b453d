"""Conversions between Python values and protobuf well-known types and payloads."""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any

from google.protobuf import duration_pb2, timestamp_pb2

# Seconds as a number, or a timedelta.
DurationLike = float | int | _dt.timedelta


def to_duration(value: DurationLike) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    if isinstance(value, _dt.timedelta):
        d.FromTimedelta(value)
    else:
        d.FromNanoseconds(round(float(value) * 1e9))
    return d


def to_timestamp(value: _dt.datetime) -> timestamp_pb2.Timestamp:
    """A naive datetime is taken as UTC."""
    if value.tzinfo is not None:
        value = value.astimezone(_dt.timezone.utc).replace(tzinfo=None)
    t = timestamp_pb2.Timestamp()
    t.FromDatetime(value)
    return t


def from_timestamp(value: timestamp_pb2.Timestamp) -> _dt.datetime:
    """An aware UTC datetime."""
    return value.ToDatetime(tzinfo=_dt.timezone.utc)


def timestamp_seconds(value: timestamp_pb2.Timestamp) -> float:
    """Seconds since the epoch, as time.time() gives them: cheaper than a datetime where a
    difference is all that is wanted."""
    return value.seconds + value.nanos / 1e9


def encode_payload(value: Any) -> bytes:
    """bytes as they are, str as UTF-8, anything else as JSON."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value, separators=(",", ":")).encode("utf-8")
