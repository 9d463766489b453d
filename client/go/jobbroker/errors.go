package jobbroker

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// IsInvalidArgument reports whether err is a gRPC status error with code InvalidArgument
// (malformed input; the message names the field).
func IsInvalidArgument(err error) bool { return status.Code(err) == codes.InvalidArgument }

// IsNotFound reports whether err has code NotFound (unknown job or queue).
func IsNotFound(err error) bool { return status.Code(err) == codes.NotFound }

// IsFailedPrecondition reports whether err has code FailedPrecondition (a stale lease).
func IsFailedPrecondition(err error) bool { return status.Code(err) == codes.FailedPrecondition }

// IsAlreadyExists reports whether err has code AlreadyExists (a dedup key held by a job with
// another payload).
func IsAlreadyExists(err error) bool { return status.Code(err) == codes.AlreadyExists }

// IsResourceExhausted reports whether err has code ResourceExhausted (a full queue, an
// oversized payload).
func IsResourceExhausted(err error) bool { return status.Code(err) == codes.ResourceExhausted }

// IsUnavailable reports whether err has code Unavailable (broker down or shutting down: retry).
func IsUnavailable(err error) bool { return status.Code(err) == codes.Unavailable }

// Why a running handler's context was cancelled: context.Cause(ctx) is one of these.
var (
	// ErrLeaseLost: the lease ran out (the broker will run the job again); do not bother acking.
	ErrLeaseLost = errors.New("jobbroker: lease lost")
	// ErrCancelRequested: an operator cancelled the job; stop and return.
	ErrCancelRequested = errors.New("jobbroker: job cancelled by an operator")
	// ErrShutdown: the worker is stopping and its grace period is over; whatever the handler
	// returns, the job is given back (no attempt spent).
	ErrShutdown = errors.New("jobbroker: worker shutting down")
	// ErrTimedOut: the attempt reached its run-time limit (LeasedJob.timeout_at); the broker
	// ended it TIMED_OUT and will retry the job as for a failure.
	ErrTimedOut = errors.New("jobbroker: attempt timed out")
)

// PermanentError fails a job with no retry: it dies with FAIL_REASON_PERMANENT. Make one with
// Permanent.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as one that another attempt cannot fix (a bad address, a validation
// error): a handler returning it fails the job for good. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// Permanentf is Permanent(fmt.Errorf(format, args...)).
func Permanentf(format string, args ...any) error {
	return Permanent(fmt.Errorf(format, args...))
}

// RetryAfterError fails an attempt and asks for the next one after Delay instead of the
// queue's backoff (e.g. a provider's Retry-After). Make one with RetryAfter.
type RetryAfterError struct {
	Delay time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string { return e.Err.Error() }
func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryAfter wraps err so that the next attempt starts after d. RetryAfter(d, nil) is nil.
func RetryAfter(d time.Duration, err error) error {
	if err == nil {
		return nil
	}
	return &RetryAfterError{Delay: d, Err: err}
}

// SnoozeError gives the job back to run again after Delay, without spending an attempt (the
// broker counts it in Job.snoozes; beyond the queue's max_snoozes the job fails). Make one with
// Snooze.
type SnoozeError struct{ Delay time.Duration }

func (e *SnoozeError) Error() string { return fmt.Sprintf("jobbroker: snoozed for %v", e.Delay) }

// Snooze is what a handler returns to try the job again after delay, when it is not ready to
// run yet (a resource is busy, a rate limit is reached): the job is SCHEDULED that much later
// and the attempt is not counted. Delay 0 makes it READY again at once.
func Snooze(delay time.Duration) error { return &SnoozeError{Delay: delay} }

func itoa(i int) string { return strconv.Itoa(i) }
