"""Errors raised by the jobbroker client, one class per gRPC status code."""

from __future__ import annotations

from typing import Any

import grpc

__all__ = [
    "JobBrokerError",
    "CancelledError",
    "UnknownError",
    "InvalidArgumentError",
    "DeadlineExceededError",
    "NotFoundError",
    "AlreadyExistsError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "FailedPreconditionError",
    "AbortedError",
    "OutOfRangeError",
    "UnimplementedError",
    "InternalError",
    "UnavailableError",
    "DataLossError",
    "UnauthenticatedError",
    "JobFailedError",
    "error_from_code",
    "error_from_rpc",
    "status_code_from_int",
]


class JobBrokerError(Exception):
    """A request the broker (or the transport to it) refused.

    `code` is the `grpc.StatusCode`; `message` the broker's explanation, which names the
    offending field for INVALID_ARGUMENT. A refused request changed nothing on the broker.
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        if code is not None:
            self.code = code
        self.message = message
        super().__init__(f"{self.code.name}: {message}")


class CancelledError(JobBrokerError):
    """The call was cancelled (not asyncio.CancelledError)."""

    code = grpc.StatusCode.CANCELLED


class UnknownError(JobBrokerError):
    code = grpc.StatusCode.UNKNOWN


class InvalidArgumentError(JobBrokerError):
    """Malformed input: an empty or over-long queue name, a negative duration, ..."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceededError(JobBrokerError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFoundError(JobBrokerError):
    """An unknown job (or, in admin calls, an unknown queue)."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(JobBrokerError):
    """A dedup key held by a job with another payload."""

    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDeniedError(JobBrokerError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhaustedError(JobBrokerError):
    """A full queue (max_length) or an oversized payload."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPreconditionError(JobBrokerError):
    """A stale lease: it ran out and the job was leased again, or the job ended."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class AbortedError(JobBrokerError):
    code = grpc.StatusCode.ABORTED


class OutOfRangeError(JobBrokerError):
    code = grpc.StatusCode.OUT_OF_RANGE


class UnimplementedError(JobBrokerError):
    code = grpc.StatusCode.UNIMPLEMENTED


class InternalError(JobBrokerError):
    code = grpc.StatusCode.INTERNAL


class UnavailableError(JobBrokerError):
    """The broker cannot be reached or is shutting down; retrying later is safe."""

    code = grpc.StatusCode.UNAVAILABLE


class DataLossError(JobBrokerError):
    code = grpc.StatusCode.DATA_LOSS


class UnauthenticatedError(JobBrokerError):
    code = grpc.StatusCode.UNAUTHENTICATED


class JobFailedError(Exception):
    """A job waited for (Client.enqueue_and_wait, Client.wait_job) ended without completing:
    FAILED (its fail_reason and last_error say why) or CANCELLED. `job` is the job as it
    ended; `state` its JobState name ("JOB_STATE_FAILED", "JOB_STATE_CANCELLED")."""

    def __init__(self, job: Any) -> None:
        from .v1 import job_pb2  # the generated module imports nothing of ours; kept local

        self.job = job
        self.state: str = job_pb2.JobState.Name(job.state)
        why = ""
        if job.state == job_pb2.JOB_STATE_FAILED:
            why = f" ({job_pb2.FailReason.Name(job.fail_reason)})"
        detail = f": {job.last_error}" if job.last_error else ""
        super().__init__(f"job {job.id} ended {self.state}{why}{detail}")


_BY_CODE: dict[grpc.StatusCode, type[JobBrokerError]] = {
    cls.code: cls
    for cls in (
        CancelledError,
        UnknownError,
        InvalidArgumentError,
        DeadlineExceededError,
        NotFoundError,
        AlreadyExistsError,
        PermissionDeniedError,
        ResourceExhaustedError,
        FailedPreconditionError,
        AbortedError,
        OutOfRangeError,
        UnimplementedError,
        InternalError,
        UnavailableError,
        DataLossError,
        UnauthenticatedError,
    )
}

_BY_INT: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}


def status_code_from_int(code: int) -> grpc.StatusCode:
    """The grpc.StatusCode of a google.rpc code number (as in WorkResult.code)."""
    return _BY_INT.get(code, grpc.StatusCode.UNKNOWN)


def error_from_code(code: grpc.StatusCode | int, message: str) -> JobBrokerError:
    """The JobBrokerError subclass for `code` (a grpc.StatusCode or its number)."""
    if isinstance(code, int):
        code = status_code_from_int(code)
    cls = _BY_CODE.get(code, JobBrokerError)
    return cls(message, code)


def error_from_rpc(err: grpc.RpcError) -> JobBrokerError:
    """Maps a failed gRPC call to a JobBrokerError."""
    code_fn = getattr(err, "code", None)
    details_fn = getattr(err, "details", None)
    code = code_fn() if callable(code_fn) else grpc.StatusCode.UNKNOWN
    details = details_fn() if callable(details_fn) else str(err)
    return error_from_code(code or grpc.StatusCode.UNKNOWN, details or "")
