package jobbroker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "jobbroker.dev/client/go/jobbrokerv1"
)

// Handler runs one attempt of a job. Returning nil acks the job (with the result set by
// Job.SetResult, if any). Returning an error fails the attempt with the error's text, and the
// broker retries it after the queue's backoff, except for errors made by Permanent (the job
// dies, no retry), RetryAfter (the next attempt starts after the given delay) and Snooze (the
// job is given back for later without spending an attempt).
//
// ctx is cancelled when the lease is lost, when the attempt reaches its time-out, when an
// operator cancels the job, or when the worker is stopping and its grace period is over;
// context.Cause(ctx) tells which (ErrLeaseLost, ErrTimedOut, ErrCancelRequested, ErrShutdown).
// It is not cancelled by the start of a graceful shutdown: a running handler may finish its
// work. The worker cannot stop a handler that ignores ctx: such a handler keeps its
// concurrency slot until it returns.
type Handler interface {
	ProcessJob(ctx context.Context, job *Job) error
}

// HandlerFunc adapts an ordinary function to a Handler.
type HandlerFunc func(ctx context.Context, job *Job) error

// ProcessJob calls f(ctx, job).
func (f HandlerFunc) ProcessJob(ctx context.Context, job *Job) error { return f(ctx, job) }

// MiddlewareFunc wraps a Handler: it gets the job's context and job and decides whether, and
// how, to call next (logging, metrics, tracing, recovering, filtering). See Worker.Use.
type MiddlewareFunc func(next Handler) Handler

// WorkerOptions configure a Worker. The zero value is usable.
type WorkerOptions struct {
	// Names this worker in attempt histories; default "<hostname>-<pid>".
	WorkerID string
	// Handlers run at once; default 1.
	Concurrency int
	// Jobs held beyond Concurrency so that a freed handler need not wait for the next push.
	// They hold leases (and are heartbeated) while they wait, start in arrival order, and a
	// graceful shutdown gives them back unstarted. Default 0.
	Prefetch int
	// Lease asked for each job; 0 = the job's, else the queue's. Heartbeats go out every third
	// of the lease, so a hung or dead worker loses its jobs after one lease.
	LeaseDuration time.Duration
	// How long Run lets running handlers finish after its context is cancelled; then their
	// contexts are cancelled (cause ErrShutdown) and their jobs given back. Default 30 s.
	ShutdownGrace time.Duration
	// Reconnect backoff when the stream breaks or the broker is down: a random wait below a
	// bound that doubles from ReconnectInitial (default 100 ms) up to ReconnectMax (default
	// 5 s), back to ReconnectInitial once a stream was subscribed.
	ReconnectInitial time.Duration
	ReconnectMax     time.Duration
	// Where the worker logs reconnects and refused requests; default slog.Default().
	Logger *slog.Logger
}

// Worker runs handlers for jobs pushed over one Broker.Work stream: Concurrency at a time,
// heartbeats while they run, ack or fail when they return, reconnects with backoff when the
// broker goes away, and stops gracefully when Run's context is cancelled. It implements the
// worker contract of docs/worker-contract.md.
//
//	w := jobbroker.NewWorker(client, jobbroker.WorkerOptions{Concurrency: 4})
//	w.HandleFunc("emails", func(ctx context.Context, job *jobbroker.Job) error {
//		return send(ctx, job.Payload, job.IdempotencyKey)
//	})
//	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
//	defer stop()
//	err := w.Run(ctx)
//
// Register handlers before Run. A Worker runs once.
//
// In a cluster (a Client made by New) the stream goes straight to the leader of the handled
// queues' partitions when they all have the same one, otherwise to any node, which relays it.
// Before it reconnects after a stream ended, the worker asks for the cluster's layout again,
// so it follows a leader that moved or died.
//
// Acks are coalesced: one ack message is in flight at a time, and the acks of jobs that end
// meanwhile go out together as one ack_batch when it is answered. Acks, fails and releases the
// broker has not answered when the stream breaks are sent again on the next stream.
type Worker struct {
	// Constant after construction (handlers: after Run starts).
	client     *Client
	opts       WorkerOptions
	log        *slog.Logger
	handlers   map[string]Handler
	middleware []MiddlewareFunc
	wake       chan struct{} // wakes the heartbeat loop for a new job
	closed     chan struct{} // closed when Run is done with the stream
	running    sync.WaitGroup

	// State below is protected by mu.
	mu           sync.Mutex
	started      bool
	stopping     bool // no new jobs: what arrives is given back
	closing      bool // the stream goes away
	nextID       uint64
	subscribeID  uint64
	streamCancel context.CancelFunc
	baseCtx      context.Context
	// The stream generation a request was made for; written with both mu and sendMu held. A
	// request made for an older generation is not sent by its maker: the new stream's first
	// messages carry it (see resumeLocked).
	gen      uint64
	held     map[string]*heldJob    // by job id: the current attempt, waiting or running
	waiting  []*heldJob             // held and not started, in arrival order
	active   map[*heldJob]struct{}  // handlers running (lost ones included)
	pending  map[uint64]*pendingReq // fails, releases and checkpoint saves not yet answered
	beats    map[uint64]*heldJob    // heartbeats (periodic and progress) not yet answered
	ackQueue []*pb.AckRequest       // acks waiting for the one in flight to be answered
	ackID    uint64                 // the request id of the ack message in flight; 0 if none
	ackSent  []*pb.AckRequest       // what that message carries
	// Answers the broker refused with Unavailable (a partition handing over to a new leader,
	// a broker draining): not final, unlike a stale lease, so they go out again after
	// answerRetryDelay, or with the next stream if it comes first.
	ackRetry   []*pb.AckRequest
	retryTimer *time.Timer // nil unless a resend is due
	stats      WorkerStats

	sendMu sync.Mutex
	stream grpc.BidiStreamingClient[pb.WorkRequest, pb.WorkResponse] // nil while disconnected
}

// The most acks one ack_batch carries (the broker's limit).
const maxAckBatch = 1000

// WorkerStats counts what a Worker did, for logs and tests.
type WorkerStats struct {
	Acked    int64 // attempts acked (handler returned nil)
	Failed   int64 // attempts failed (handler returned an error or panicked)
	Released int64 // jobs given back by a graceful shutdown (unstarted, or at the end of grace)
	Snoozed  int64 // jobs given back for later by Snooze
	// Ack and ack_batch messages put in flight, resends after a reconnect included. Acks
	// coalesce, so a busy worker sends far fewer than Acked.
	AckMessages int64
	Reconnects  int64 // Work streams that ended while the worker ran
}

// Stats returns what the worker has done so far.
func (w *Worker) Stats() WorkerStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stats
}

// heldJob is one attempt the worker holds. Its fields are guarded by Worker.mu.
type heldJob struct {
	leased  *pb.LeasedJob
	job     *Job
	handler Handler
	ctx     context.Context
	cancel  context.CancelCauseFunc
	lease   time.Duration // as granted: deadline - arrival
	// Fires the cancellation at LeasedJob.timeout_at; nil if the job has no time-out.
	timeout  *time.Timer
	nextBeat time.Time
	started  bool // handed to its handler
	// The broker has ended the attempt (lease lost or timed out): no more heartbeats, and no
	// answer when the handler returns.
	lost bool
	// Cancelled by an operator: a handler ending with an error fails the attempt "cancelled".
	cancelRequested bool
	// Cancelled at the end of a graceful shutdown's grace: the job is released.
	graceOver bool
	// Progress: one heartbeat with progress in flight; the newest value waits for its answer.
	progressID   uint64 // request id of the progress heartbeat in flight; 0 if none
	progressSent []byte
	progressNext []byte
	hasNext      bool
}

type pendingReq struct {
	req  *pb.WorkRequest
	done chan *pb.WorkResult // nil unless someone waits for the answer
	// The attempt a checkpoint save is for; nil for a fail or release.
	held *heldJob
	// Refused with Unavailable; sent again by resendRefused (or the next stream).
	refused bool
}

// How long an answer refused with Unavailable waits before it is sent again.
const answerRetryDelay = 250 * time.Millisecond

// retryable: an answer to an ack, fail, release or checkpoint save that is not final. The
// broker could not apply it now (the partition has no serving leader, storage refused the
// write) and says "retry"; the lease may still be valid, so dropping it would run the job
// again (or, for a checkpoint save, fail an attempt that did nothing wrong).
func retryable(code int32) bool { return codes.Code(code) == codes.Unavailable }

// NewWorker makes a worker that uses client's connection.
func NewWorker(client *Client, opts WorkerOptions) *Worker {
	if opts.WorkerID == "" {
		opts.WorkerID = defaultWorkerID()
	}
	if opts.Concurrency < 1 {
		opts.Concurrency = 1
	}
	if opts.Prefetch < 0 {
		opts.Prefetch = 0
	}
	if opts.ShutdownGrace <= 0 {
		opts.ShutdownGrace = 30 * time.Second
	}
	if opts.ReconnectInitial <= 0 {
		opts.ReconnectInitial = 100 * time.Millisecond
	}
	if opts.ReconnectMax < opts.ReconnectInitial {
		opts.ReconnectMax = max(5*time.Second, opts.ReconnectInitial)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Worker{
		client:   client,
		opts:     opts,
		log:      log.With("worker_id", opts.WorkerID),
		handlers: map[string]Handler{},
		wake:     make(chan struct{}, 1),
		closed:   make(chan struct{}),
		nextID:   1,
		held:     map[string]*heldJob{},
		active:   map[*heldJob]struct{}{},
		pending:  map[uint64]*pendingReq{},
		beats:    map[uint64]*heldJob{},
	}
}

// Handle registers the handler of queue, the way http.ServeMux and asynq's ServeMux register
// a handler per pattern; the worker subscribes to exactly the queues that have one (the
// broker's subscription names queues, so a pattern could not say what to subscribe to).
// Registering a queue twice replaces its handler. Call it before Run.
func (w *Worker) Handle(queue string, h Handler) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		panic("jobbroker: Worker.Handle called after Run")
	}
	if h == nil {
		panic("jobbroker: Worker.Handle with a nil handler")
	}
	w.handlers[queue] = h
}

// HandleFunc registers fn as the handler of queue (see Handle).
func (w *Worker) HandleFunc(queue string, fn func(ctx context.Context, job *Job) error) {
	w.Handle(queue, HandlerFunc(fn))
}

// Use appends middleware that wraps every handler call of this worker, whatever the queue.
// Middlewares run in the order they were added: the first one added is the outermost, it sees
// the job first and the handler's result last. What the outermost returns is the attempt's
// result (nil acks, an error fails, as for a Handler). Call it before Run.
func (w *Worker) Use(mws ...MiddlewareFunc) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		panic("jobbroker: Worker.Use called after Run")
	}
	w.middleware = append(w.middleware, mws...)
}

// wrapHandlersLocked applies the middleware to every handler once, at Run, so that Use and
// Handle may come in either order.
func (w *Worker) wrapHandlersLocked() {
	for q, h := range w.handlers {
		for i := len(w.middleware) - 1; i >= 0; i-- {
			h = w.middleware[i](h)
		}
		w.handlers[q] = h
	}
}

// Run subscribes to the queues that have handlers and runs jobs until ctx is cancelled, then
// shuts down gracefully: it takes no new jobs, gives back the jobs it holds but has not
// started, lets running handlers finish (up to ShutdownGrace; then it cancels their contexts,
// waits for them to return and gives their jobs back), waits up to 1 s more for the broker to
// answer its acks, fails and releases, closes the stream and returns nil.
//
// A broker that cannot be reached is not an error: Run keeps reconnecting with backoff. A
// stream the broker ends with a code that retrying cannot fix (InvalidArgument for a malformed
// queue name, Unauthenticated, PermissionDenied, ...) is: Run shuts down and returns that
// status error.
func (w *Worker) Run(ctx context.Context) error {
	w.mu.Lock()
	if w.started {
		w.mu.Unlock()
		return errors.New("jobbroker: Worker.Run called twice")
	}
	if len(w.handlers) == 0 {
		w.mu.Unlock()
		return errors.New("jobbroker: register a handler with Worker.Handle before Run")
	}
	w.started = true
	w.wrapHandlersLocked()
	w.baseCtx = context.WithoutCancel(ctx)
	w.mu.Unlock()

	fatal := make(chan error, 1)
	connDone := make(chan struct{})
	heartbeatsDone := make(chan struct{})
	go func() { defer close(connDone); w.connectionLoop(fatal) }()
	go func() { defer close(heartbeatsDone); w.heartbeatLoop() }()

	var err error
	select {
	case <-ctx.Done():
	case err = <-fatal:
	}
	w.shutdown()
	w.closeStream(connDone)
	<-heartbeatsDone
	return err
}

// shutdown runs the graceful stop up to the broker's last answers.
func (w *Worker) shutdown() {
	graceEnd := time.Now().Add(w.opts.ShutdownGrace)
	w.mu.Lock()
	w.stopping = true
	out := []*pb.WorkRequest{{
		RequestId: w.newIDLocked(),
		Request:   &pb.WorkRequest_Flow{Flow: &pb.FlowRequest{MaxInFlight: 0}},
	}}
	waiting := w.waiting
	w.waiting = nil
	for _, h := range waiting {
		out = append(out, w.giveBackUnstartedLocked(h))
	}
	gen := w.gen
	w.mu.Unlock()
	for _, r := range out {
		w.send(r, gen)
	}

	handlersDone := make(chan struct{})
	go func() { w.running.Wait(); close(handlersDone) }()
	timer := time.NewTimer(time.Until(graceEnd))
	defer timer.Stop()
	select {
	case <-handlersDone:
	case <-timer.C:
		w.log.Warn("jobbroker: shutdown grace period over: cancelling running handlers")
		w.mu.Lock()
		for h := range w.active {
			h.graceOver = true
			h.cancel(ErrShutdown)
		}
		w.mu.Unlock()
		<-handlersDone
	}

	// The last answers get 1 s past the grace (or past the last handler, if one overran it).
	answerBy := graceEnd
	if now := time.Now(); now.After(answerBy) {
		answerBy = now
	}
	answerBy = answerBy.Add(time.Second)
	for time.Now().Before(answerBy) {
		if w.unanswered() == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	w.log.Warn("jobbroker: shutting down with unanswered requests", "count", w.unanswered())
}

// unanswered counts the acks, fails, releases and checkpoint saves the broker has not answered.
func (w *Worker) unanswered() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.pending) + len(w.ackSent) + len(w.ackQueue) + len(w.ackRetry)
}

// closeStream half-closes the stream, gives the broker 2 s to end it, then cancels it.
func (w *Worker) closeStream(connDone <-chan struct{}) {
	w.sendMu.Lock()
	w.mu.Lock()
	w.closing = true
	cancel := w.streamCancel
	w.mu.Unlock()
	if w.stream != nil {
		_ = w.stream.CloseSend()
		w.stream = nil
	}
	w.sendMu.Unlock()
	close(w.closed)
	select {
	case <-connDone:
	case <-time.After(2 * time.Second):
	}
	if cancel != nil {
		cancel()
	}
	<-connDone
}

func (w *Worker) newIDLocked() uint64 {
	id := w.nextID
	w.nextID++
	return id
}

// forgetLocked removes h from what the worker holds (it stays in active while it runs).
func (w *Worker) forgetLocked(h *heldJob) {
	if w.held[h.leased.GetJobId()] == h {
		delete(w.held, h.leased.GetJobId())
	}
	if !h.started {
		if i := slices.Index(w.waiting, h); i >= 0 {
			w.waiting = slices.Delete(w.waiting, i, i+1)
		}
	}
	if h.timeout != nil {
		h.timeout.Stop()
	}
}

// giveBackUnstartedLocked releases a held job that has not started (graceful stop).
func (w *Worker) giveBackUnstartedLocked(h *heldJob) *pb.WorkRequest {
	w.forgetLocked(h)
	h.cancel(ErrShutdown)
	w.stats.Released++
	return w.releaseRequestLocked(h.leased, 0)
}

// releaseRequestLocked makes a release (a snooze when delay > 0), pending until answered.
func (w *Worker) releaseRequestLocked(l *pb.LeasedJob, delay time.Duration) *pb.WorkRequest {
	rel := &pb.ReleaseRequest{JobId: l.GetJobId(), LeaseId: l.GetLeaseId()}
	if delay > 0 {
		rel.Delay = durationpb.New(delay)
	}
	r := &pb.WorkRequest{RequestId: w.newIDLocked(), Request: &pb.WorkRequest_Release{Release: rel}}
	w.pending[r.RequestId] = &pendingReq{req: r}
	return r
}

// loseLocked: the broker ended h's attempt (lease lost, timed out). The handler's context is
// cancelled with cause; nothing more is sent for the attempt.
func (w *Worker) loseLocked(h *heldJob, cause error) {
	if h.lost {
		return
	}
	h.lost = true
	h.cancel(cause)
	w.forgetLocked(h)
	// A checkpoint save of h refused Unavailable and waiting to be sent again never will be
	// applied now: its step fails as for a stale lease instead of waiting on.
	for id, p := range w.pending {
		if p.held == h && p.refused {
			delete(w.pending, id)
			if p.done != nil {
				p.done <- leaseGoneResult(h)
			}
		}
	}
}

// leaseGoneResult is the answer a checkpoint save of h gets when h's lease was lost (or its
// attempt timed out) before the broker could apply it: a stale lease.
func leaseGoneResult(h *heldJob) *pb.WorkResult {
	why := ErrLeaseLost
	if h != nil {
		if cause := context.Cause(h.ctx); cause != nil {
			why = cause
		}
	}
	return &pb.WorkResult{Code: int32(codes.FailedPrecondition),
		Message: "checkpoint not saved: " + why.Error() + " before the broker could apply it"}
}

// send writes r on the current stream if r was made for it (gen). A request that is not sent
// stays pending and goes out on the next stream; a request of an older stream was already
// resent by the new one.
func (w *Worker) send(r *pb.WorkRequest, gen uint64) {
	if r == nil {
		return
	}
	w.sendMu.Lock()
	defer w.sendMu.Unlock()
	if w.stream == nil || w.gen != gen {
		return
	}
	_ = w.stream.Send(r) // a broken stream shows up in Recv, which reconnects
}

func (w *Worker) connectionLoop(fatal chan<- error) {
	backoff := w.opts.ReconnectInitial
	// In a cluster the stream goes to the leader of the handled queues' partitions when they
	// share one, else to any node, which relays it to each queue's leader.
	queues := route{queues: slices.Sorted(maps.Keys(w.handlers))}
	for {
		streamCtx, cancel := context.WithCancel(withStreamRoute(context.Background(), queues))
		stream, err := w.client.broker.Work(streamCtx)
		subscribed := false
		if err == nil {
			w.sendMu.Lock()
			w.mu.Lock()
			if w.closing {
				w.mu.Unlock()
				w.sendMu.Unlock()
				cancel()
				return
			}
			w.streamCancel = cancel
			first := w.resumeLocked()
			w.mu.Unlock()
			w.stream = stream
			for _, r := range first {
				if stream.Send(r) != nil {
					break
				}
			}
			w.sendMu.Unlock()
			for {
				var msg *pb.WorkResponse
				msg, err = stream.Recv()
				if err != nil {
					break
				}
				ok, refusal := w.onMessage(msg)
				if ok {
					subscribed = true
					backoff = w.opts.ReconnectInitial
				}
				if refusal != nil {
					select {
					case fatal <- refusal:
					default:
					}
				}
			}
			w.sendMu.Lock()
			if w.stream == stream {
				w.stream = nil
			}
			w.sendMu.Unlock()
		}
		cancel()
		// Its node may have died or stopped leading the queues: the next stream goes where the
		// cluster's layout says they are now.
		w.client.markRoutingStale()
		w.mu.Lock()
		closing := w.closing
		if !closing {
			w.stats.Reconnects++
		}
		w.mu.Unlock()
		if closing {
			return
		}
		if code := status.Code(err); reconnectable(code) {
			w.log.Warn("jobbroker: stream to the broker ended; reconnecting", "err", err, "subscribed", subscribed)
		} else {
			w.log.Error("jobbroker: the broker refused the stream", "err", err)
			select {
			case fatal <- err:
			default:
			}
		}
		// Full jitter, so that workers a broker restart disconnected together come back spread.
		select {
		case <-w.closed:
			return
		case <-time.After(rand.N(backoff) + time.Millisecond):
		}
		backoff = min(backoff*2, w.opts.ReconnectMax)
	}
}

// resumeLocked starts a new stream generation and returns its first messages: the subscribe
// (unless stopping), then every ack, fail, release and checkpoint save the last stream left
// unanswered (idempotent per lease, so sending them again is safe), then the newest progress
// of each job. Periodic heartbeats are not replayed: the loop sends the next ones.
func (w *Worker) resumeLocked() []*pb.WorkRequest {
	w.gen++
	var first []*pb.WorkRequest
	if !w.stopping {
		queues := make([]string, 0, len(w.handlers))
		for q := range w.handlers {
			queues = append(queues, q)
		}
		sort.Strings(queues)
		sub := &pb.SubscribeRequest{
			Queues:      queues,
			WorkerId:    w.opts.WorkerID,
			MaxInFlight: int32(w.opts.Concurrency + w.opts.Prefetch),
			BatchPushes: true,
		}
		if w.opts.LeaseDuration > 0 {
			sub.LeaseDuration = durationpb.New(w.opts.LeaseDuration)
		}
		w.subscribeID = w.newIDLocked()
		first = append(first, &pb.WorkRequest{RequestId: w.subscribeID, Request: &pb.WorkRequest_Subscribe{Subscribe: sub}})
	}
	ids := make([]uint64, 0, len(w.pending))
	for id := range w.pending {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		w.pending[id].refused = false
		first = append(first, w.pending[id].req)
	}
	w.requeueRefusedLocked()
	if w.ackID != 0 {
		w.ackQueue = append(w.ackSent, w.ackQueue...)
		w.ackID, w.ackSent = 0, nil
	}
	if r := w.nextAckLocked(); r != nil {
		first = append(first, r)
	}
	clear(w.beats) // their answers will not come
	for _, h := range w.held {
		if h.progressID != 0 {
			h.progressID = 0
			if !h.hasNext {
				h.progressNext, h.hasNext = h.progressSent, true
			}
		}
		if r := w.nextProgressLocked(h); r != nil {
			first = append(first, r)
		}
	}
	return first
}

// reconnectable: the stream ended for a reason a new stream may not have (the contract's list;
// OK is a broker that shut down).
func reconnectable(c codes.Code) bool {
	switch c {
	case codes.OK, codes.Unavailable, codes.Unknown, codes.Internal, codes.DeadlineExceeded,
		codes.Canceled, codes.Aborted, codes.ResourceExhausted:
		return true
	}
	return false
}

func leaseGone(code int32) bool {
	return codes.Code(code) == codes.FailedPrecondition || codes.Code(code) == codes.NotFound
}

// onMessage handles one message from the broker. It reports whether the message accepted
// this stream's subscription, and the refusal if it refused it.
func (w *Worker) onMessage(m *pb.WorkResponse) (subscribed bool, refusal error) {
	switch r := m.GetResponse().(type) {
	case *pb.WorkResponse_Job:
		w.onJobs([]*pb.LeasedJob{r.Job})
	case *pb.WorkResponse_JobBatch:
		w.onJobs(r.JobBatch.GetJobs())
	case *pb.WorkResponse_Result:
		return w.onResult(r.Result)
	case *pb.WorkResponse_LeaseLost:
		w.mu.Lock()
		defer w.mu.Unlock()
		if h, ok := w.held[r.LeaseLost.GetJobId()]; ok {
			cause := ErrLeaseLost
			if r.LeaseLost.GetOutcome() == pb.AttemptOutcome_ATTEMPT_OUTCOME_TIMED_OUT {
				cause = ErrTimedOut
			}
			w.loseLocked(h, cause)
		}
	case *pb.WorkResponse_CancelRequested:
		w.mu.Lock()
		if h, ok := w.held[r.CancelRequested.GetJobId()]; ok {
			r, gen := w.cancelRequestedLocked(h), w.gen
			w.mu.Unlock()
			w.send(r, gen)
			return false, nil
		}
		w.mu.Unlock()
	}
	return false, nil
}

// cancelRequestedLocked: an operator cancelled h. A running handler's context is cancelled;
// a job still waiting for a slot is released at once (the broker then cancels it).
func (w *Worker) cancelRequestedLocked(h *heldJob) *pb.WorkRequest {
	if h.cancelRequested || h.lost {
		return nil
	}
	h.cancelRequested = true
	h.cancel(ErrCancelRequested)
	if h.started {
		return nil
	}
	w.forgetLocked(h)
	return w.releaseRequestLocked(h.leased, 0)
}

func (w *Worker) onResult(res *pb.WorkResult) (subscribed bool, refusal error) {
	id := res.GetRequestId()
	var out []*pb.WorkRequest
	w.mu.Lock()
	gen := w.gen
	switch {
	case id == w.subscribeID:
		w.mu.Unlock()
		switch codes.Code(res.GetCode()) {
		case codes.OK:
			return true, nil
		case codes.Unavailable:
			// The broker is stopping, or (cluster mode) a queue's partition has no leader
			// right now. The broker may leave such a stream open without a subscription, so
			// end it here: the connection loop reconnects after its backoff.
			w.log.Warn("jobbroker: subscription refused for now; reconnecting", "message", res.GetMessage())
			w.mu.Lock()
			cancel := w.streamCancel
			w.mu.Unlock()
			if cancel != nil {
				cancel()
			}
			return false, nil
		default:
			err := status.Error(codes.Code(res.GetCode()), res.GetMessage())
			w.log.Error("jobbroker: subscription refused", "err", err)
			return false, err
		}
	case id != 0 && id == w.ackID:
		w.onAckResultLocked(res)
		out = append(out, w.nextAckLocked())
	case w.pending[id] != nil:
		p := w.pending[id]
		if retryable(res.GetCode()) && (p.held == nil || !p.held.lost) {
			// A checkpoint save too: its step keeps waiting until the save is applied (or
			// the lease is gone: see loseLocked).
			p.refused = true
			w.log.Info("jobbroker: answer refused for now; sending it again", "message", res.GetMessage())
			w.scheduleResendLocked()
			break
		}
		delete(w.pending, id)
		if retryable(res.GetCode()) {
			// A checkpoint save refused again after its lease was lost: it can no longer be
			// applied, so its step fails as for a stale lease.
			res = leaseGoneResult(p.held)
		}
		if res.GetCode() != 0 {
			w.logRefusalLocked(p.req, res.GetCode(), res.GetMessage())
		}
		if hb := p.req.GetHeartbeat(); hb != nil {
			if h := w.held[hb.GetJobId()]; h != nil && h.leased.GetLeaseId() == hb.GetLeaseId() {
				out = append(out, w.onHeartbeatResultLocked(h, res))
			}
		}
		if p.done != nil {
			p.done <- res
		}
	case w.beats[id] != nil:
		h := w.beats[id]
		delete(w.beats, id)
		if h.progressID == id {
			h.progressID = 0
			out = append(out, w.nextProgressLocked(h))
		}
		if w.held[h.leased.GetJobId()] == h {
			out = append(out, w.onHeartbeatResultLocked(h, res))
		}
	}
	w.mu.Unlock()
	for _, r := range out {
		w.send(r, gen)
	}
	return false, nil
}

// onAckResultLocked takes the answer to the ack message in flight: each item's error is that
// job's answer.
func (w *Worker) onAckResultLocked(res *pb.WorkResult) {
	sent := w.ackSent
	w.ackID, w.ackSent = 0, nil
	if retryable(res.GetCode()) {
		w.log.Info("jobbroker: acks refused for now; sending them again", "count", len(sent), "message", res.GetMessage())
		w.ackRetry = append(w.ackRetry, sent...)
		w.scheduleResendLocked()
		return
	}
	if res.GetCode() != 0 {
		// The message as a whole was refused (a malformed item): every ack in it has that
		// answer.
		for _, a := range sent {
			w.logRefusalLocked(&pb.WorkRequest{Request: &pb.WorkRequest_Ack{Ack: a}}, res.GetCode(), res.GetMessage())
		}
		return
	}
	for _, e := range res.GetItemErrors() {
		if i := int(e.GetIndex()); i >= 0 && i < len(sent) && retryable(e.GetCode()) {
			w.log.Info("jobbroker: ack refused for now; sending it again", "job_id", sent[i].GetJobId(), "message", e.GetMessage())
			w.ackRetry = append(w.ackRetry, sent[i])
			w.scheduleResendLocked()
		} else if i >= 0 && i < len(sent) {
			w.logRefusalLocked(&pb.WorkRequest{Request: &pb.WorkRequest_Ack{Ack: sent[i]}}, e.GetCode(), e.GetMessage())
		}
	}
}

// scheduleResendLocked arranges for resendRefused to run after answerRetryDelay.
func (w *Worker) scheduleResendLocked() {
	if w.retryTimer == nil {
		w.retryTimer = time.AfterFunc(answerRetryDelay, w.resendRefused)
	}
}

// resendRefused sends again the acks, fails, releases and checkpoint saves the broker refused
// with Unavailable.
func (w *Worker) resendRefused() {
	var out []*pb.WorkRequest
	w.mu.Lock()
	w.retryTimer = nil
	w.requeueRefusedLocked()
	if r := w.nextAckLocked(); r != nil {
		out = append(out, r)
	}
	ids := make([]uint64, 0)
	for id, p := range w.pending {
		if p.refused {
			p.refused = false
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		out = append(out, w.pending[id].req)
	}
	gen := w.gen
	w.mu.Unlock()
	for _, r := range out {
		w.send(r, gen)
	}
}

// requeueRefusedLocked puts the refused acks back first in line.
func (w *Worker) requeueRefusedLocked() {
	if len(w.ackRetry) > 0 {
		w.ackQueue = append(w.ackRetry, w.ackQueue...)
		w.ackRetry = nil
	}
}

// logRefusalLocked logs a request the broker did not apply. A stale lease is routine (the
// attempt already ended: the job runs again elsewhere, or an operator ended it).
func (w *Worker) logRefusalLocked(r *pb.WorkRequest, code int32, message string) {
	level := slog.LevelWarn
	if leaseGone(code) {
		level = slog.LevelInfo
	}
	kind, jobID := "request", ""
	switch x := r.GetRequest().(type) {
	case *pb.WorkRequest_Ack:
		kind, jobID = "ack", x.Ack.GetJobId()
	case *pb.WorkRequest_Fail:
		kind, jobID = "fail", x.Fail.GetJobId()
	case *pb.WorkRequest_Release:
		kind, jobID = "release", x.Release.GetJobId()
	case *pb.WorkRequest_Heartbeat:
		kind, jobID = "heartbeat", x.Heartbeat.GetJobId()
		if x.Heartbeat.Checkpoint != nil {
			kind = "checkpoint save"
		}
	}
	w.log.Log(context.Background(), level, "jobbroker: "+kind+" refused",
		"job_id", jobID, "code", codes.Code(code).String(), "message", message)
}

// onHeartbeatResultLocked applies a heartbeat's answer to the job it was for.
func (w *Worker) onHeartbeatResultLocked(h *heldJob, res *pb.WorkResult) *pb.WorkRequest {
	if leaseGone(res.GetCode()) {
		w.loseLocked(h, ErrLeaseLost)
		return nil
	}
	if res.GetCancelRequested() {
		return w.cancelRequestedLocked(h)
	}
	return nil
}

// queueAckLocked adds an ack; it returns the ack message to send now, if none is in flight.
func (w *Worker) queueAckLocked(a *pb.AckRequest) *pb.WorkRequest {
	w.ackQueue = append(w.ackQueue, a)
	return w.nextAckLocked()
}

// nextAckLocked puts the waiting acks (up to maxAckBatch) in flight as one message, unless one
// is in flight already.
func (w *Worker) nextAckLocked() *pb.WorkRequest {
	if w.ackID != 0 || len(w.ackQueue) == 0 {
		return nil
	}
	n := min(len(w.ackQueue), maxAckBatch)
	w.ackSent = slices.Clone(w.ackQueue[:n])
	w.ackQueue = slices.Delete(w.ackQueue, 0, n)
	w.ackID = w.newIDLocked()
	w.stats.AckMessages++
	r := &pb.WorkRequest{RequestId: w.ackID}
	if n == 1 {
		r.Request = &pb.WorkRequest_Ack{Ack: w.ackSent[0]}
	} else {
		r.Request = &pb.WorkRequest_AckBatch{AckBatch: &pb.AckBatchRequest{Acks: w.ackSent}}
	}
	return r
}

// onJobs takes pushed jobs, in order.
func (w *Worker) onJobs(jobs []*pb.LeasedJob) {
	now := time.Now()
	var out []*pb.WorkRequest
	w.mu.Lock()
	for _, l := range jobs {
		if r := w.onJobLocked(l, now); r != nil {
			out = append(out, r)
		}
	}
	w.startWaitingLocked()
	gen := w.gen
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	for _, r := range out {
		w.send(r, gen)
	}
}

// onJobLocked holds a pushed job, or returns the release that gives it back.
func (w *Worker) onJobLocked(l *pb.LeasedJob, now time.Time) *pb.WorkRequest {
	handler := w.handlers[l.GetQueue()]
	if w.stopping || handler == nil { // pushed before our flow 0 arrived (or not ours): give it back
		if w.stopping {
			w.stats.Released++
		}
		return w.releaseRequestLocked(l, 0)
	}
	// Heartbeats follow the lease as granted; the floor guards against clock skew.
	lease := max(l.GetLeaseDeadline().AsTime().Sub(now), 300*time.Millisecond)
	h := &heldJob{
		leased:   l,
		job:      newJob(l),
		handler:  handler,
		lease:    lease,
		nextBeat: now.Add(lease / 3),
	}
	h.ctx, h.cancel = context.WithCancelCause(w.baseCtx)
	h.job.saveCheckpoint = func(ctx context.Context, cp []byte) error { return w.saveCheckpoint(ctx, h, cp) }
	h.job.reportProgress = func(p []byte) { w.reportProgress(h, p) }
	if old, ok := w.held[l.GetJobId()]; ok { // an older attempt of ours lost its lease
		w.loseLocked(old, ErrLeaseLost)
	}
	if t := l.GetTimeoutAt(); t != nil {
		// The broker ends the attempt TIMED_OUT at this moment; the handler hears it now rather
		// than when the lease_lost notice arrives.
		h.timeout = time.AfterFunc(time.Until(t.AsTime()), func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.loseLocked(h, ErrTimedOut)
		})
	}
	w.held[l.GetJobId()] = h
	w.waiting = append(w.waiting, h)
	return nil
}

// startWaitingLocked hands waiting jobs, oldest first, to handlers while there are free slots.
func (w *Worker) startWaitingLocked() {
	for len(w.active) < w.opts.Concurrency && len(w.waiting) > 0 && !w.stopping {
		h := w.waiting[0]
		w.waiting = slices.Delete(w.waiting, 0, 1)
		h.started = true
		w.active[h] = struct{}{}
		w.running.Add(1)
		go w.runJob(h)
	}
}

func (w *Worker) runJob(h *heldJob) {
	defer w.running.Done()
	err := w.callHandler(h)
	h.cancel(context.Canceled)

	w.mu.Lock()
	delete(w.active, h)
	w.forgetLocked(h)
	r := w.answerLocked(h, err)
	w.startWaitingLocked()
	gen := w.gen
	w.mu.Unlock()
	w.send(r, gen)
}

// answerLocked decides what the end of h's handler (with err) sends: the contract's table.
func (w *Worker) answerLocked(h *heldJob, err error) *pb.WorkRequest {
	jobID, leaseID := h.leased.GetJobId(), h.leased.GetLeaseId()
	if h.lost {
		// The broker ended the attempt (lease lost, time-out) and would refuse any answer.
		w.log.Info("jobbroker: handler ended after its attempt was ended by the broker", "job_id", jobID, "err", err)
		return nil
	}
	if h.graceOver {
		// The stop was not the job's fault: it runs again, no attempt spent.
		w.stats.Released++
		return w.releaseRequestLocked(h.leased, 0)
	}
	fail := func(f *pb.FailRequest) *pb.WorkRequest {
		w.stats.Failed++
		f.JobId, f.LeaseId = jobID, leaseID
		r := &pb.WorkRequest{RequestId: w.newIDLocked(), Request: &pb.WorkRequest_Fail{Fail: f}}
		w.pending[r.RequestId] = &pendingReq{req: r}
		return r
	}
	if err == nil {
		w.stats.Acked++
		return w.queueAckLocked(&pb.AckRequest{JobId: jobID, LeaseId: leaseID, Result: h.job.getResult()})
	}
	if h.cancelRequested {
		return fail(&pb.FailRequest{Error: "cancelled"}) // the broker keeps the job CANCELLED
	}
	var snooze *SnoozeError
	if errors.As(err, &snooze) {
		w.stats.Snoozed++
		return w.releaseRequestLocked(h.leased, snooze.Delay)
	}
	f := &pb.FailRequest{Error: err.Error()}
	var perm *PermanentError
	f.Permanent = errors.As(err, &perm)
	var after *RetryAfterError
	if errors.As(err, &after) && after.Delay > 0 {
		f.RetryAfter = durationpb.New(after.Delay)
	}
	return fail(f)
}

func (w *Worker) callHandler(h *heldJob) (err error) {
	defer func() {
		if p := recover(); p != nil {
			w.log.Error("jobbroker: handler panicked", "job_id", h.job.ID, "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("handler panicked: %v", p)
		}
	}()
	return h.handler.ProcessJob(h.ctx, h.job)
}

// saveCheckpoint sends a heartbeat carrying cp at once and waits for the broker's answer. A save
// answered Unavailable is sent again (after answerRetryDelay, or on the next stream) and
// waited for; if the lease is lost meanwhile it fails as for a stale lease.
func (w *Worker) saveCheckpoint(ctx context.Context, h *heldJob, cp []byte) error {
	done := make(chan *pb.WorkResult, 1)
	w.mu.Lock()
	if w.closing {
		w.mu.Unlock()
		return ErrShutdown
	}
	if h.lost {
		w.mu.Unlock()
		return context.Cause(h.ctx)
	}
	r := &pb.WorkRequest{
		RequestId: w.newIDLocked(),
		Request: &pb.WorkRequest_Heartbeat{Heartbeat: &pb.HeartbeatRequest{
			JobId: h.leased.GetJobId(), LeaseId: h.leased.GetLeaseId(), Checkpoint: cp,
		}},
	}
	w.pending[r.RequestId] = &pendingReq{req: r, done: done, held: h}
	h.nextBeat = time.Now().Add(h.lease / 3)
	gen := w.gen
	w.mu.Unlock()
	w.send(r, gen)
	select {
	case res := <-done:
		if res.GetCode() != 0 {
			return status.Error(codes.Code(res.GetCode()), res.GetMessage())
		}
		return nil
	case <-ctx.Done():
		w.mu.Lock()
		delete(w.pending, r.RequestId)
		w.mu.Unlock()
		return context.Cause(ctx)
	}
}

// reportProgress sends p as h's progress at once, or, while a progress heartbeat is in flight,
// keeps it to send when that one is answered (only the newest value waits).
func (w *Worker) reportProgress(h *heldJob, p []byte) {
	w.mu.Lock()
	if h.lost || w.held[h.leased.GetJobId()] != h {
		w.mu.Unlock()
		return
	}
	h.progressNext, h.hasNext = p, true
	r, gen := w.nextProgressLocked(h), w.gen
	w.mu.Unlock()
	w.send(r, gen)
}

// nextProgressLocked puts h's waiting progress in flight, unless one is in flight already.
func (w *Worker) nextProgressLocked(h *heldJob) *pb.WorkRequest {
	if h.progressID != 0 || !h.hasNext || h.lost {
		return nil
	}
	p := h.progressNext
	h.progressNext, h.hasNext = nil, false
	if p == nil {
		p = []byte{} // set, so the broker replaces the progress
	}
	r := &pb.WorkRequest{
		RequestId: w.newIDLocked(),
		Request: &pb.WorkRequest_Heartbeat{Heartbeat: &pb.HeartbeatRequest{
			JobId: h.leased.GetJobId(), LeaseId: h.leased.GetLeaseId(), Progress: p,
		}},
	}
	w.beats[r.RequestId] = h
	h.progressID, h.progressSent = r.RequestId, p
	h.nextBeat = time.Now().Add(h.lease / 3)
	return r
}

func (w *Worker) heartbeatLoop() {
	for {
		now := time.Now()
		next := now.Add(time.Second)
		var out []*pb.WorkRequest
		w.mu.Lock()
		for id, h := range w.held {
			if !h.nextBeat.After(now) {
				r := &pb.WorkRequest{
					RequestId: w.newIDLocked(),
					Request: &pb.WorkRequest_Heartbeat{Heartbeat: &pb.HeartbeatRequest{
						JobId: id, LeaseId: h.leased.GetLeaseId(),
					}},
				}
				w.beats[r.RequestId] = h
				h.nextBeat = now.Add(h.lease / 3)
				out = append(out, r)
			}
			if h.nextBeat.Before(next) {
				next = h.nextBeat
			}
		}
		gen := w.gen
		w.mu.Unlock()
		for _, r := range out {
			w.send(r, gen)
		}
		timer := time.NewTimer(time.Until(next))
		select {
		case <-w.closed:
			timer.Stop()
			return
		case <-w.wake:
		case <-timer.C:
		}
		timer.Stop()
	}
}
