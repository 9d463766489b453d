package jobbroker

import (
	"context"

	pb "jobbroker.dev/client/go/jobbrokerv1"
)

// EnqueueFunc sends jobs to the broker: one job for Enqueue, the batch for EnqueueBatch. It
// returns one Enqueued per job, in order.
type EnqueueFunc func(ctx context.Context, jobs []*pb.EnqueueRequest) ([]Enqueued, error)

// EnqueueMiddleware is producer middleware (Options.EnqueueMiddleware): it wraps the sending of
// jobs, and may change them first (add headers: a trace context, the caller's identity), look
// at the results or the error, or not call next at all (its result is then the call's). The
// first one in Options.EnqueueMiddleware is the outermost. It runs once per call, before any
// retry, so it sees each job once.
type EnqueueMiddleware func(next EnqueueFunc) EnqueueFunc

// throughMiddleware puts the client's producer middleware around send.
func (c *Client) throughMiddleware(send EnqueueFunc) EnqueueFunc {
	for i := len(c.enqueueMiddleware) - 1; i >= 0; i-- {
		send = c.enqueueMiddleware[i](send)
	}
	return send
}
