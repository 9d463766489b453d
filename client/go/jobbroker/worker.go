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

// WorkerOptions configure a Worker. The zero value is usable. The connection its streams go
// over is its client's, set by Options: addresses, TLS, token, and the keepalive pings
// (Options.KeepaliveTime, KeepaliveTimeout, DisableKeepalive) by which a stream to a broker
// that froze or went silent ends Unavailable and is reopened after the reconnect backoff.
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
	// Reconnect backoff when a stream breaks or the broker is down: a random wait below a
	// bound that doubles from ReconnectInitial (default 100 ms) up to ReconnectMax (default
	// 5 s), back to ReconnectInitial once a stream was subscribed.
	ReconnectInitial time.Duration
	ReconnectMax     time.Duration
	// Where the worker logs reconnects and refused requests; default slog.Default().
	Logger *slog.Logger
}

// Worker runs handlers for jobs pushed over Broker.Work streams: Concurrency at a time,
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
// In a cluster (a Client made by New) the worker holds one stream per leading node
// (docs/worker-contract.md §5): the handled queues are grouped by their partition's leader,
// and each group's stream goes straight to that leader, subscribing to the group's queues with
// a share of Concurrency+Prefetch as its max_in_flight, so that no node relays a stream.
// Queues whose partition has no leader go on one more stream, to any node; while it has that
// stream the worker asks for the layout again after each backoff delay and regroups, so those
// queues move to their leader's own stream once it is known. Handlers are one pool across the
// streams. When any stream ends, the worker waits its backoff, asks for the
// cluster's layout again and groups anew: the streams of groups that are still the same keep
// running, the others are ended and the new ones opened, so it follows a leader that moved or
// died. Without the layout (a single broker, or one that refuses GetCluster) it holds one
// stream over every queue, on the first address that answers.
//
// A job's heartbeats and answers go on the stream that pushed it while that stream is open,
// else on any open stream (a node routes them to the job's leader), else with the next stream.
// Acks are coalesced per stream: one ack message is in flight at a time, and the acks of jobs
// that end meanwhile go out together as one ack_batch when it is answered. Acks, fails and
// releases the broker has not answered when a stream breaks are sent again on another stream.
type Worker struct {
	// Constant after construction (handlers: after Run starts).
	client     *Client
	opts       WorkerOptions
	log        *slog.Logger
	handlers   map[string]Handler
	middleware []MiddlewareFunc
	wake       chan struct{} // wakes the heartbeat loop for a new job
	closed     chan struct{} // closed when Run is done with the streams
	running    sync.WaitGroup

	// State below is protected by mu.
	mu      sync.Mutex
	started bool
	// No new jobs: what arrives is given back. Streams that end are still reopened (without a
	// subscription) so that the answers still to come reach the broker, until closing.
	stopping bool
	closing  bool // the streams go away
	nextID   uint64
	baseCtx  context.Context
	streams  []*workStream          // open, in the order they opened: where answers may go
	held     map[string]*heldJob    // by job id: the current attempt, waiting or running
	waiting  []*heldJob             // held and not started, in arrival order
	active   map[*heldJob]struct{}  // handlers running (lost ones included)
	pending  map[uint64]*pendingReq // fails, releases and checkpoint saves not yet answered
	beats    map[uint64]beat        // heartbeats (periodic and progress) not yet answered
	// Acks that found no open stream: they go out on the next one.
	orphanAcks []*pb.AckRequest
	retryTimer *time.Timer   // nil unless a resend is due
	backoff    time.Duration // the bound of the next reconnect wait
	stats      WorkerStats
}

// workStream is one Broker.Work stream of a Worker, for one streamGroup.
type workStream struct {
	group  streamGroup
	cancel context.CancelFunc // ends the stream at once

	// Under Worker.mu.
	open        bool // takes requests: attached, and not yet ended or retired
	retired     bool // ended by a regrouping, not by the broker
	subscribeID uint64
	ackQueue    []*pb.AckRequest // acks waiting for the one in flight to be answered
	ackID       uint64           // the request id of the ack message in flight; 0 if none
	ackSent     []*pb.AckRequest // what that message carries
	// Acks the broker refused with Unavailable (a partition handing over to a new leader, a
	// broker draining): not final, unlike a stale lease, so they go out again after
	// answerRetryDelay, or on another stream if this one ends first.
	ackRetry []*pb.AckRequest

	// Lock order: sendMu, then Worker.mu.
	sendMu sync.Mutex
	stream grpc.BidiStreamingClient[pb.WorkRequest, pb.WorkResponse] // nil unless open

	// Written by the stream's goroutine before it reports the end.
	err        error
	subscribed bool
}

// send writes r on s if s is still open. A request not sent is not lost: the worker made it
// pending, and a stream that ends hands what it had not answered to another (detachLocked).
func (s *workStream) send(r *pb.WorkRequest) {
	if r == nil || s == nil {
		return
	}
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if s.stream != nil {
		_ = s.stream.Send(r) // a broken stream shows up in Recv, which ends it
	}
}

// outgoing is a request and the stream it was given to (nil: none open, it waits).
type outgoing struct {
	r *pb.WorkRequest
	s *workStream
}

func sendAll(out []outgoing) {
	for _, o := range out {
		o.s.send(o.r)
	}
}

// beat is a heartbeat in flight: the job it is for, and the stream it went on.
type beat struct {
	h   *heldJob
	via *workStream
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
	via     *workStream // the stream that pushed it: its answers go there while it is open
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
	origin  *workStream // the stream that pushed the job
	via     *workStream // the stream it went on; nil while none was open
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
		beats:    map[uint64]beat{},
		backoff:  opts.ReconnectInitial,
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
// answer its acks, fails and releases, closes the streams and returns nil.
//
// A broker that cannot be reached is not an error: Run keeps reconnecting with backoff. A
// stream (any of them) the broker ends with a code that retrying cannot fix (InvalidArgument for a malformed
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
	w.closeStreams(connDone)
	<-heartbeatsDone
	return err
}

// shutdown runs the graceful stop up to the broker's last answers.
func (w *Worker) shutdown() {
	graceEnd := time.Now().Add(w.opts.ShutdownGrace)
	w.mu.Lock()
	w.stopping = true
	var out []outgoing
	for _, s := range w.streams {
		out = append(out, outgoing{&pb.WorkRequest{
			RequestId: w.newIDLocked(),
			Request:   &pb.WorkRequest_Flow{Flow: &pb.FlowRequest{MaxInFlight: 0}},
		}, s})
	}
	waiting := w.waiting
	w.waiting = nil
	for _, h := range waiting {
		out = append(out, w.giveBackUnstartedLocked(h))
	}
	w.mu.Unlock()
	sendAll(out)

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
	n := len(w.pending) + len(w.orphanAcks)
	for _, s := range w.streams {
		n += len(s.ackSent) + len(s.ackQueue) + len(s.ackRetry)
	}
	return n
}

// closeStreams half-closes every stream; the connection loop gives the broker 2 s to end
// them, then cancels them.
func (w *Worker) closeStreams(connDone <-chan struct{}) {
	w.mu.Lock()
	w.closing = true
	streams := slices.Clone(w.streams)
	w.mu.Unlock()
	for _, s := range streams {
		s.sendMu.Lock()
		if s.stream != nil {
			_ = s.stream.CloseSend()
			s.stream = nil
		}
		s.sendMu.Unlock()
	}
	close(w.closed)
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
func (w *Worker) giveBackUnstartedLocked(h *heldJob) outgoing {
	w.forgetLocked(h)
	h.cancel(ErrShutdown)
	w.stats.Released++
	return w.releaseRequestLocked(h.leased, 0, h.via)
}

// releaseRequestLocked makes a release (a snooze when delay > 0) of a job origin pushed,
// pending until answered.
func (w *Worker) releaseRequestLocked(l *pb.LeasedJob, delay time.Duration, origin *workStream) outgoing {
	rel := &pb.ReleaseRequest{JobId: l.GetJobId(), LeaseId: l.GetLeaseId()}
	if delay > 0 {
		rel.Delay = durationpb.New(delay)
	}
	r := &pb.WorkRequest{RequestId: w.newIDLocked(), Request: &pb.WorkRequest_Release{Release: rel}}
	return w.pendLocked(&pendingReq{req: r, origin: origin})
}

// pendLocked keeps p until it is answered and gives it to a stream (streamForLocked).
func (w *Worker) pendLocked(p *pendingReq) outgoing {
	w.pending[p.req.GetRequestId()] = p
	p.via = w.streamForLocked(p.origin)
	return outgoing{p.req, p.via}
}

// streamForLocked is where a request about a job origin pushed goes: origin while it is open,
// else any open stream (a node routes a job's answer to its leader by job id), else nil: it
// waits for the next stream.
func (w *Worker) streamForLocked(origin *workStream) *workStream {
	if origin != nil && origin.open {
		return origin
	}
	if len(w.streams) > 0 {
		return w.streams[0]
	}
	return nil
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

// connectionLoop keeps one stream per group of the handled queues (streamGroup): it opens the
// groups' streams and, each time one ends, waits the backoff, asks for the cluster's layout
// again and regroups. While a cluster's layout leaves a group for any node, it also asks again
// and regroups after each backoff delay when no stream ended (docs/worker-contract.md §5): the
// node that stream went to may relay it to a leader elected meanwhile, and nothing would end
// that relay. It returns once every stream it opened has ended, after Run closed w.closed.
func (w *Worker) connectionLoop(fatal chan<- error) {
	queues := slices.Sorted(maps.Keys(w.handlers))
	maxInFlight := w.opts.Concurrency + w.opts.Prefetch
	lookupCtx, cancelLookups := context.WithCancel(context.Background())
	defer cancelLookups()
	go func() { <-w.closed; cancelLookups() }()

	ended := make(chan *workStream)
	live := map[*workStream]struct{}{} // started and not yet reported ended
	var current []*workStream          // the streams of the latest grouping that have not ended
	// onEnd takes a stream's end; it reports whether the stream was one of the grouping's
	// (not one a regrouping retired).
	onEnd := func(s *workStream) bool {
		delete(live, s)
		if s.retired {
			return false
		}
		current = slices.DeleteFunc(current, func(c *workStream) bool { return c == s })
		w.mu.Lock()
		closing := w.closing
		if !closing {
			w.stats.Reconnects++
		}
		w.mu.Unlock()
		if closing {
			return true
		}
		if code := status.Code(s.err); reconnectable(code) {
			w.log.Warn("jobbroker: stream to the broker ended; reconnecting", "err", s.err,
				"address", s.group.address, "queues", s.group.queues, "subscribed", s.subscribed)
		} else {
			w.log.Error("jobbroker: the broker refused the stream", "err", s.err)
			select {
			case fatal <- s.err:
			default:
			}
		}
		return true
	}

	for {
		// Each stream's node may have died or stopped leading its queues: the groups are made
		// from the cluster's layout as it is now.
		groups, recheck := w.client.workGroups(lookupCtx, queues, maxInFlight)
		var retire, open []*workStream
		// While stopping too (docs/worker-contract.md §6): a stream that ends before the streams
		// are closed is reopened, regrouped, so that the acks, fails and releases still to come
		// reach the broker. attachLocked does not subscribe a stream opened while stopping, so
		// it is pushed nothing. Once closing, nothing is opened.
		w.mu.Lock()
		if !w.closing {
			var next []*workStream
			for _, s := range current {
				if slices.ContainsFunc(groups, s.group.equal) {
					next = append(next, s)
				} else {
					retire = append(retire, s)
				}
			}
			for _, g := range groups {
				if !slices.ContainsFunc(next, func(s *workStream) bool { return s.group.equal(g) }) {
					s := &workStream{group: g}
					next = append(next, s)
					open = append(open, s)
				}
			}
			current = next
		}
		w.mu.Unlock()
		for _, s := range retire {
			w.retire(s)
		}
		for _, s := range open {
			ctx, cancel := context.WithCancel(withStreamRoute(context.Background(), route{address: s.group.address}))
			s.cancel = cancel
			live[s] = struct{}{}
			go func() { w.runStream(ctx, s, fatal); ended <- s }()
		}

		// Until one of the grouping's streams ends, or (with a group for any node) the backoff
		// delay is over: then the layout is fetched again without a further wait. Run's close
		// (step 6 of the graceful stop) ends both.
		var recheckTimer *time.Timer
		var recheckDue <-chan time.Time
		if recheck {
			recheckTimer = time.NewTimer(w.nextBackoffWait())
			recheckDue = recheckTimer.C
		}
		streamEnded, rechecking := false, false
		for !streamEnded && !rechecking {
			select {
			case s := <-ended:
				streamEnded = onEnd(s)
			case <-recheckDue:
				rechecking = true
			case <-w.closed:
				if recheckTimer != nil {
					recheckTimer.Stop()
				}
				w.endAll(live, ended)
				return
			}
		}
		if recheckTimer != nil {
			recheckTimer.Stop()
		}
		w.client.markRoutingStale()
		if rechecking {
			continue // its delay was the backoff: regroup now
		}
		timer := time.NewTimer(w.nextBackoffWait())
		for waiting := true; waiting; {
			select {
			case s := <-ended:
				onEnd(s)
			case <-timer.C:
				waiting = false
			case <-w.closed:
				timer.Stop()
				w.endAll(live, ended)
				return
			}
		}
	}
}

// nextBackoffWait draws the next wait of the worker's one backoff, with full jitter (so that
// workers a broker restart disconnected together come back spread), and doubles the bound up
// to ReconnectMax; a stream that subscribes sets it back to ReconnectInitial.
func (w *Worker) nextBackoffWait() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	wait := rand.N(w.backoff) + time.Millisecond
	w.backoff = min(w.backoff*2, w.opts.ReconnectMax)
	return wait
}

// endAll waits for the streams still live after closeStreams half-closed them: the broker gets
// 2 s to end them, then they are cancelled.
func (w *Worker) endAll(live map[*workStream]struct{}, ended <-chan *workStream) {
	giveUp := time.NewTimer(2 * time.Second)
	defer giveUp.Stop()
	for len(live) > 0 {
		select {
		case s := <-ended:
			delete(live, s)
		case <-giveUp.C:
			for s := range live {
				s.cancel()
			}
		}
	}
}

// retire ends s because its group is not in the new grouping: what it had not answered goes
// on the other streams (or waits for the new ones), it is half-closed, and cancelled 2 s later
// if the broker has not ended it. Its jobs keep running: their leases stay valid, and their
// answers go on another stream.
func (w *Worker) retire(s *workStream) {
	s.sendMu.Lock()
	w.mu.Lock()
	s.retired = true
	out := w.detachLocked(s)
	w.mu.Unlock()
	if s.stream != nil {
		_ = s.stream.CloseSend()
		s.stream = nil
	}
	s.sendMu.Unlock()
	sendAll(out)
	time.AfterFunc(2*time.Second, s.cancel)
}

// runStream opens s's stream, subscribes and takes what the broker sends until the stream
// ends; s.err is why it ended.
func (w *Worker) runStream(ctx context.Context, s *workStream, fatal chan<- error) {
	defer s.cancel()
	stream, err := w.client.broker.Work(ctx)
	if err != nil {
		s.err = err
		return
	}
	s.sendMu.Lock()
	w.mu.Lock()
	if w.closing || s.retired {
		w.mu.Unlock()
		s.sendMu.Unlock()
		s.err = status.Error(codes.Canceled, "the stream's group was ended before it opened")
		return
	}
	first, more := w.attachLocked(s)
	w.mu.Unlock()
	s.stream = stream
	for _, r := range first {
		if stream.Send(r) != nil {
			break
		}
	}
	s.sendMu.Unlock()
	sendAll(more)
	for {
		msg, err := stream.Recv()
		if err != nil {
			s.err = err
			break
		}
		if refusal := w.onMessage(s, msg); refusal != nil {
			select {
			case fatal <- refusal:
			default:
			}
		}
	}
	s.sendMu.Lock()
	s.stream = nil
	w.mu.Lock()
	out := w.detachLocked(s)
	w.mu.Unlock()
	s.sendMu.Unlock()
	sendAll(out)
}

// attachLocked makes s open and returns its first messages: the subscribe, then the fails, releases and checkpoint saves that found no open stream, then the acks that
// did not (idempotent per lease, so a resend is safe). more is the progress of jobs that could
// not send theirs, for whichever stream each goes on. Periodic heartbeats are not replayed:
// the loop sends the next ones. A stream opened during a graceful stop does not subscribe: it
// only carries the answers still to come, and is pushed nothing (the contract's flow 0 and
// release of what such a stream is pushed, without a push to release).
func (w *Worker) attachLocked(s *workStream) (first []*pb.WorkRequest, more []outgoing) {
	s.open = true
	w.streams = append(w.streams, s)
	if !w.stopping {
		sub := &pb.SubscribeRequest{
			Queues:      s.group.queues,
			WorkerId:    w.opts.WorkerID,
			MaxInFlight: int32(s.group.maxInFlight),
			BatchPushes: true,
		}
		if w.opts.LeaseDuration > 0 {
			sub.LeaseDuration = durationpb.New(w.opts.LeaseDuration)
		}
		s.subscribeID = w.newIDLocked()
		first = append(first, &pb.WorkRequest{RequestId: s.subscribeID, Request: &pb.WorkRequest_Subscribe{Subscribe: sub}})
	}
	for _, id := range slices.Sorted(maps.Keys(w.pending)) {
		if p := w.pending[id]; p.via == nil {
			p.via, p.refused = s, false
			first = append(first, p.req)
		}
	}
	if len(w.orphanAcks) > 0 {
		s.ackQueue = append(s.ackQueue, w.orphanAcks...)
		w.orphanAcks = nil
	}
	if o := w.nextAckLocked(s); o.r != nil {
		first = append(first, o.r)
	}
	for _, h := range w.held {
		if o := w.nextProgressLocked(h); o.r != nil {
			more = append(more, o)
		}
	}
	return first, more
}

// detachLocked ends s as a way out for requests (it ended, or a regrouping ended it): what it
// had not answered goes on another open stream, or waits for the next one. Its answers that
// still arrive are taken as usual; an answered resend is ignored.
func (w *Worker) detachLocked(s *workStream) []outgoing {
	if !s.open {
		return nil
	}
	s.open = false
	w.streams = slices.DeleteFunc(w.streams, func(o *workStream) bool { return o == s })
	var out []outgoing
	acks := slices.Concat(s.ackRetry, s.ackSent, s.ackQueue)
	s.ackRetry, s.ackSent, s.ackQueue, s.ackID = nil, nil, nil, 0
	if len(acks) > 0 {
		if t := w.streamForLocked(nil); t != nil {
			t.ackQueue = append(t.ackQueue, acks...)
			out = append(out, w.nextAckLocked(t))
		} else {
			w.orphanAcks = append(w.orphanAcks, acks...)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(w.pending)) {
		if p := w.pending[id]; p.via == s {
			p.refused = false
			p.via = w.streamForLocked(p.origin)
			out = append(out, outgoing{p.req, p.via})
		}
	}
	for id, b := range w.beats {
		if b.via != s {
			continue
		}
		delete(w.beats, id) // its answer will not come
		if h := b.h; h.progressID == id {
			h.progressID = 0
			if !h.hasNext {
				h.progressNext, h.hasNext = h.progressSent, true
			}
			out = append(out, w.nextProgressLocked(h))
		}
	}
	return out
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

// onMessage handles one message from the broker on s. It returns the refusal of s's
// subscription, if the message is one that ends the run call.
func (w *Worker) onMessage(s *workStream, m *pb.WorkResponse) (refusal error) {
	switch r := m.GetResponse().(type) {
	case *pb.WorkResponse_Job:
		w.onJobs(s, []*pb.LeasedJob{r.Job})
	case *pb.WorkResponse_JobBatch:
		w.onJobs(s, r.JobBatch.GetJobs())
	case *pb.WorkResponse_Result:
		return w.onResult(s, r.Result)
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
			o := w.cancelRequestedLocked(h)
			w.mu.Unlock()
			o.s.send(o.r)
			return nil
		}
		w.mu.Unlock()
	}
	return nil
}

// cancelRequestedLocked: an operator cancelled h. A running handler's context is cancelled;
// a job still waiting for a slot is released at once (the broker then cancels it).
func (w *Worker) cancelRequestedLocked(h *heldJob) outgoing {
	if h.cancelRequested || h.lost {
		return outgoing{}
	}
	h.cancelRequested = true
	h.cancel(ErrCancelRequested)
	if h.started {
		return outgoing{}
	}
	w.forgetLocked(h)
	return w.releaseRequestLocked(h.leased, 0, h.via)
}

// onResult takes the broker's answer to a request, on s.
func (w *Worker) onResult(s *workStream, res *pb.WorkResult) (refusal error) {
	id := res.GetRequestId()
	var out []outgoing
	w.mu.Lock()
	switch {
	case id != 0 && id == s.subscribeID:
		switch codes.Code(res.GetCode()) {
		case codes.OK:
			s.subscribed = true
			w.backoff = w.opts.ReconnectInitial
			w.mu.Unlock()
			return nil
		case codes.Unavailable:
			w.mu.Unlock()
			// The broker is stopping, or (cluster mode) a queue's partition has no leader
			// right now. The broker may leave such a stream open without a subscription, so
			// end it here: the connection loop regroups after its backoff.
			w.log.Warn("jobbroker: subscription refused for now; reconnecting", "message", res.GetMessage())
			s.cancel()
			return nil
		default:
			w.mu.Unlock()
			err := status.Error(codes.Code(res.GetCode()), res.GetMessage())
			w.log.Error("jobbroker: subscription refused", "err", err)
			return err
		}
	case id != 0 && id == s.ackID:
		w.onAckResultLocked(s, res)
		out = append(out, w.nextAckLocked(s))
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
	case w.beats[id].h != nil:
		h := w.beats[id].h
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
	sendAll(out)
	return nil
}

// onAckResultLocked takes the answer to s's ack message in flight: each item's error is that
// job's answer.
func (w *Worker) onAckResultLocked(s *workStream, res *pb.WorkResult) {
	sent := s.ackSent
	s.ackID, s.ackSent = 0, nil
	if retryable(res.GetCode()) {
		w.log.Info("jobbroker: acks refused for now; sending them again", "count", len(sent), "message", res.GetMessage())
		s.ackRetry = append(s.ackRetry, sent...)
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
			s.ackRetry = append(s.ackRetry, sent[i])
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
	var out []outgoing
	w.mu.Lock()
	w.retryTimer = nil
	for _, s := range w.streams {
		// The refused acks go back first in line.
		if len(s.ackRetry) > 0 {
			s.ackQueue = append(s.ackRetry, s.ackQueue...)
			s.ackRetry = nil
		}
		out = append(out, w.nextAckLocked(s))
	}
	for _, id := range slices.Sorted(maps.Keys(w.pending)) {
		if p := w.pending[id]; p.refused {
			p.refused = false
			if p.via = w.streamForLocked(p.origin); p.via != nil {
				out = append(out, outgoing{p.req, p.via})
			}
		}
	}
	w.mu.Unlock()
	sendAll(out)
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
func (w *Worker) onHeartbeatResultLocked(h *heldJob, res *pb.WorkResult) outgoing {
	if leaseGone(res.GetCode()) {
		w.loseLocked(h, ErrLeaseLost)
		return outgoing{}
	}
	if res.GetCancelRequested() {
		return w.cancelRequestedLocked(h)
	}
	return outgoing{}
}

// queueAckLocked adds the ack of a job origin pushed to the queue of the stream it goes on; it
// returns the ack message to send now, if none is in flight there. With no stream open it
// waits for the next one.
func (w *Worker) queueAckLocked(a *pb.AckRequest, origin *workStream) outgoing {
	s := w.streamForLocked(origin)
	if s == nil {
		w.orphanAcks = append(w.orphanAcks, a)
		return outgoing{}
	}
	s.ackQueue = append(s.ackQueue, a)
	return w.nextAckLocked(s)
}

// nextAckLocked puts s's waiting acks (up to maxAckBatch) in flight as one message, unless one
// is in flight already.
func (w *Worker) nextAckLocked(s *workStream) outgoing {
	if s.ackID != 0 || len(s.ackQueue) == 0 {
		return outgoing{}
	}
	n := min(len(s.ackQueue), maxAckBatch)
	s.ackSent = slices.Clone(s.ackQueue[:n])
	s.ackQueue = slices.Delete(s.ackQueue, 0, n)
	s.ackID = w.newIDLocked()
	w.stats.AckMessages++
	r := &pb.WorkRequest{RequestId: s.ackID}
	if n == 1 {
		r.Request = &pb.WorkRequest_Ack{Ack: s.ackSent[0]}
	} else {
		r.Request = &pb.WorkRequest_AckBatch{AckBatch: &pb.AckBatchRequest{Acks: s.ackSent}}
	}
	return outgoing{r, s}
}

// onJobs takes jobs pushed on s, in order.
func (w *Worker) onJobs(s *workStream, jobs []*pb.LeasedJob) {
	now := time.Now()
	var out []outgoing
	w.mu.Lock()
	for _, l := range jobs {
		out = append(out, w.onJobLocked(s, l, now))
	}
	w.startWaitingLocked()
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	sendAll(out)
}

// onJobLocked holds a job s pushed, or returns the release that gives it back.
func (w *Worker) onJobLocked(s *workStream, l *pb.LeasedJob, now time.Time) outgoing {
	handler := w.handlers[l.GetQueue()]
	if w.stopping || handler == nil { // pushed before our flow 0 arrived (or not ours): give it back
		if w.stopping {
			w.stats.Released++
		}
		return w.releaseRequestLocked(l, 0, s)
	}
	// Heartbeats follow the lease as granted; the floor guards against clock skew.
	lease := max(l.GetLeaseDeadline().AsTime().Sub(now), 300*time.Millisecond)
	h := &heldJob{
		via:      s,
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
	return outgoing{}
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
	o := w.answerLocked(h, err)
	w.startWaitingLocked()
	w.mu.Unlock()
	o.s.send(o.r)
}

// answerLocked decides what the end of h's handler (with err) sends: the contract's table.
func (w *Worker) answerLocked(h *heldJob, err error) outgoing {
	jobID, leaseID := h.leased.GetJobId(), h.leased.GetLeaseId()
	if h.lost {
		// The broker ended the attempt (lease lost, time-out) and would refuse any answer.
		w.log.Info("jobbroker: handler ended after its attempt was ended by the broker", "job_id", jobID, "err", err)
		return outgoing{}
	}
	if h.graceOver {
		// The stop was not the job's fault: it runs again, no attempt spent.
		w.stats.Released++
		return w.releaseRequestLocked(h.leased, 0, h.via)
	}
	fail := func(f *pb.FailRequest) outgoing {
		w.stats.Failed++
		f.JobId, f.LeaseId = jobID, leaseID
		r := &pb.WorkRequest{RequestId: w.newIDLocked(), Request: &pb.WorkRequest_Fail{Fail: f}}
		return w.pendLocked(&pendingReq{req: r, origin: h.via})
	}
	if err == nil {
		w.stats.Acked++
		return w.queueAckLocked(&pb.AckRequest{JobId: jobID, LeaseId: leaseID, Result: h.job.getResult()}, h.via)
	}
	if h.cancelRequested {
		return fail(&pb.FailRequest{Error: "cancelled"}) // the broker keeps the job CANCELLED
	}
	var snooze *SnoozeError
	if errors.As(err, &snooze) {
		w.stats.Snoozed++
		return w.releaseRequestLocked(h.leased, snooze.Delay, h.via)
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
	o := w.pendLocked(&pendingReq{req: r, done: done, held: h, origin: h.via})
	h.nextBeat = time.Now().Add(h.lease / 3)
	w.mu.Unlock()
	o.s.send(o.r)
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
	o := w.nextProgressLocked(h)
	w.mu.Unlock()
	o.s.send(o.r)
}

// nextProgressLocked puts h's waiting progress in flight, unless one is in flight already or
// no stream is open (the next stream sends it: attachLocked).
func (w *Worker) nextProgressLocked(h *heldJob) outgoing {
	s := w.streamForLocked(h.via)
	if h.progressID != 0 || !h.hasNext || h.lost || s == nil {
		return outgoing{}
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
	w.beats[r.RequestId] = beat{h, s}
	h.progressID, h.progressSent = r.RequestId, p
	h.nextBeat = time.Now().Add(h.lease / 3)
	return outgoing{r, s}
}

func (w *Worker) heartbeatLoop() {
	for {
		now := time.Now()
		next := now.Add(time.Second)
		var out []outgoing
		w.mu.Lock()
		for id, h := range w.held {
			if !h.nextBeat.After(now) {
				// With no stream open the beat is skipped: the lease outlasts the next two.
				if s := w.streamForLocked(h.via); s != nil {
					r := &pb.WorkRequest{
						RequestId: w.newIDLocked(),
						Request: &pb.WorkRequest_Heartbeat{Heartbeat: &pb.HeartbeatRequest{
							JobId: id, LeaseId: h.leased.GetLeaseId(),
						}},
					}
					w.beats[r.RequestId] = beat{h, s}
					out = append(out, outgoing{r, s})
				}
				h.nextBeat = now.Add(h.lease / 3)
			}
			if h.nextBeat.Before(next) {
				next = h.nextBeat
			}
		}
		w.mu.Unlock()
		sendAll(out)
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
