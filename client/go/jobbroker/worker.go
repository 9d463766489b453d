package jobbroker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
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
// dies, no retry) and RetryAfter (the next attempt starts after the given delay).
//
// ctx is cancelled when the lease is lost, when an operator cancels the job, or when the worker
// is stopping and its grace period is over; context.Cause(ctx) tells which (ErrLeaseLost,
// ErrCancelRequested, ErrShutdown). It is not cancelled by the start of a graceful shutdown:
// a running handler may finish its work.
type Handler func(ctx context.Context, job *Job) error

// WorkerOptions configure a Worker. The zero value is usable.
type WorkerOptions struct {
	// Names this worker in attempt histories; default "<hostname>-<pid>".
	WorkerID string
	// Handlers run at once; default 1.
	Concurrency int
	// Jobs held beyond Concurrency so that a freed handler need not wait for the next push.
	// They hold leases while they wait; a graceful shutdown gives them back unstarted. Default 0.
	Prefetch int
	// Lease asked for each job; 0 = the job's, else the queue's. Heartbeats go out every third
	// of the lease, so a hung or dead worker loses its jobs after one lease.
	LeaseDuration time.Duration
	// How long Run lets running handlers finish after its context is cancelled; then their
	// contexts are cancelled (cause ErrShutdown). Default 30 s.
	ShutdownGrace time.Duration
	// Reconnect backoff when the stream breaks or the broker is down: doubles from
	// ReconnectInitial (default 100 ms) up to ReconnectMax (default 5 s).
	ReconnectInitial time.Duration
	ReconnectMax     time.Duration
	// Where the worker logs reconnects and refused requests; default slog.Default().
	Logger *slog.Logger
}

// Worker runs handlers for jobs pushed over one Broker.Work stream: Concurrency at a time,
// heartbeats while they run, ack or fail when they return, reconnects with backoff when the
// broker goes away, and stops gracefully when Run's context is cancelled.
//
//	w := jobbroker.NewWorker(client, jobbroker.WorkerOptions{Concurrency: 4})
//	w.Handle("emails", func(ctx context.Context, job *jobbroker.Job) error {
//		return send(ctx, job.Payload, job.IdempotencyKey)
//	})
//	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
//	defer stop()
//	err := w.Run(ctx)
//
// Register handlers before Run. A Worker runs once.
type Worker struct {
	client   *Client
	opts     WorkerOptions
	log      *slog.Logger
	handlers map[string]Handler
	sem      chan struct{} // one token per running handler
	wake     chan struct{} // wakes the heartbeat loop for a new job
	closed   chan struct{} // closed when Run is done with the stream
	jobs     sync.WaitGroup

	mu           sync.Mutex
	started      bool
	stopping     bool // no new jobs
	closing      bool // the stream goes away
	nextID       uint64
	subscribeID  uint64
	streamCancel context.CancelFunc
	baseCtx      context.Context
	held         map[string]*heldJob    // by job id: waiting for a handler slot, or running
	pending      map[uint64]*pendingReq // ack, fail, release and step heartbeats not yet answered
	beats        map[uint64]string      // periodic heartbeats not yet answered -> job id
	stats        WorkerStats

	sendMu sync.Mutex
	stream grpc.BidiStreamingClient[pb.WorkRequest, pb.WorkResponse]
}

// WorkerStats counts what a Worker did, for logs and tests.
type WorkerStats struct {
	Acked      int64 // attempts acked (handler returned nil)
	Failed     int64 // attempts failed (handler returned an error or panicked)
	Released   int64 // jobs given back unstarted (graceful shutdown)
	Reconnects int64 // Work streams that ended while the worker ran
}

// Stats returns what the worker has done so far.
func (w *Worker) Stats() WorkerStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stats
}

type heldJob struct {
	leased   *pb.LeasedJob
	job      *Job
	ctx      context.Context
	cancel   context.CancelCauseFunc
	lease    time.Duration // as granted: deadline - arrival
	nextBeat time.Time
	lost     bool          // the lease is gone: no more heartbeats
	started  bool          // the handler runs
	released bool          // given back before it started
	abandon  chan struct{} // closed when released
}

type pendingReq struct {
	req  *pb.WorkRequest
	done chan *pb.WorkResult // nil unless someone waits for the answer
}

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
		sem:      make(chan struct{}, opts.Concurrency),
		wake:     make(chan struct{}, 1),
		closed:   make(chan struct{}),
		nextID:   1,
		held:     map[string]*heldJob{},
		pending:  map[uint64]*pendingReq{},
		beats:    map[uint64]string{},
	}
}

// Handle registers the handler of queue. Call it before Run.
func (w *Worker) Handle(queue string, h Handler) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		panic("jobbroker: Worker.Handle called after Run")
	}
	w.handlers[queue] = h
}

// Run subscribes to the queues that have handlers and runs jobs until ctx is cancelled, then
// shuts down gracefully: it takes no new jobs, gives back the jobs it holds but has not
// started, lets running handlers finish (up to ShutdownGrace, then cancels their contexts and
// waits for them to return), waits for the broker to answer their acks and fails, and returns
// nil.
//
// A broker that cannot be reached is not an error: Run keeps reconnecting with backoff. A
// subscription the broker refuses (e.g. InvalidArgument for a malformed queue name) is: Run
// shuts down and returns that status error.
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
	w.baseCtx = context.WithoutCancel(ctx)
	w.mu.Unlock()

	fatal := make(chan error, 1)
	var loops sync.WaitGroup
	loops.Add(2)
	go func() { defer loops.Done(); w.connectionLoop(fatal) }()
	go func() { defer loops.Done(); w.heartbeatLoop() }()

	var err error
	select {
	case <-ctx.Done():
	case err = <-fatal:
	}
	w.shutdown()
	w.mu.Lock()
	w.closing = true
	if w.streamCancel != nil {
		w.streamCancel()
	}
	w.mu.Unlock()
	close(w.closed)
	loops.Wait()
	return err
}

func (w *Worker) shutdown() {
	deadline := time.Now().Add(w.opts.ShutdownGrace)
	w.mu.Lock()
	w.stopping = true
	out := []*pb.WorkRequest{{
		RequestId: w.newIDLocked(),
		Request:   &pb.WorkRequest_Flow{Flow: &pb.FlowRequest{MaxInFlight: 0}},
	}}
	for _, h := range w.held {
		if !h.started {
			out = append(out, w.releaseLocked(h))
		}
	}
	w.mu.Unlock()
	for _, r := range out {
		w.send(r)
	}

	done := make(chan struct{})
	go func() { w.jobs.Wait(); close(done) }()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		w.log.Warn("jobbroker: shutdown grace period over: cancelling running handlers")
		w.mu.Lock()
		for _, h := range w.held {
			h.cancel(ErrShutdown)
		}
		w.mu.Unlock()
		<-done
	}

	// The broker's answers to the last acks and fails get until the end of the grace period,
	// and at least a few seconds.
	answerBy := deadline
	if minimum := time.Now().Add(3 * time.Second); answerBy.Before(minimum) {
		answerBy = minimum
	}
	for time.Now().Before(answerBy) {
		w.mu.Lock()
		n := len(w.pending)
		w.mu.Unlock()
		if n == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	w.log.Warn("jobbroker: shutting down with unanswered requests")
}

func (w *Worker) newIDLocked() uint64 {
	id := w.nextID
	w.nextID++
	return id
}

// releaseLocked gives back a job that has not started; its handler goroutine exits.
func (w *Worker) releaseLocked(h *heldJob) *pb.WorkRequest {
	h.released = true
	close(h.abandon)
	if w.held[h.leased.GetJobId()] == h {
		delete(w.held, h.leased.GetJobId())
	}
	return w.releaseRequestLocked(h.leased)
}

func (w *Worker) releaseRequestLocked(l *pb.LeasedJob) *pb.WorkRequest {
	r := &pb.WorkRequest{
		RequestId: w.newIDLocked(),
		Request:   &pb.WorkRequest_Release{Release: &pb.ReleaseRequest{JobId: l.GetJobId(), LeaseId: l.GetLeaseId()}},
	}
	w.pending[r.RequestId] = &pendingReq{req: r}
	w.stats.Released++
	return r
}

// send writes r on the current stream; false if there is none or it broke. An unanswered ack,
// fail or release stays pending and goes out again after the reconnect.
func (w *Worker) send(r *pb.WorkRequest) bool {
	w.sendMu.Lock()
	defer w.sendMu.Unlock()
	if w.stream == nil {
		return false
	}
	return w.stream.Send(r) == nil
}

func (w *Worker) connectionLoop(fatal chan<- error) {
	backoff := w.opts.ReconnectInitial
	for {
		streamCtx, cancel := context.WithCancel(context.Background())
		stream, err := w.client.broker.Work(streamCtx)
		var first []*pb.WorkRequest
		w.mu.Lock()
		if w.closing {
			w.mu.Unlock()
			cancel()
			return
		}
		w.streamCancel = cancel
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
			}
			if w.opts.LeaseDuration > 0 {
				sub.LeaseDuration = durationpb.New(w.opts.LeaseDuration)
			}
			w.subscribeID = w.newIDLocked()
			first = append(first, &pb.WorkRequest{RequestId: w.subscribeID, Request: &pb.WorkRequest_Subscribe{Subscribe: sub}})
		}
		// Acks, fails, releases and checkpoint saves the last stream did not answer: they are
		// idempotent per lease, so sending them again is safe.
		ids := make([]uint64, 0, len(w.pending))
		for id := range w.pending {
			ids = append(ids, id)
		}
		sort.Slice(ids, func(a, b int) bool { return ids[a] < ids[b] })
		for _, id := range ids {
			first = append(first, w.pending[id].req)
		}
		w.mu.Unlock()

		subscribed := false
		if err == nil {
			w.sendMu.Lock()
			w.stream = stream
			w.sendMu.Unlock()
			for _, r := range first {
				w.send(r)
			}
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
			w.stream = nil
			w.sendMu.Unlock()
		}
		cancel()
		w.mu.Lock()
		closing := w.closing
		clear(w.beats) // their answers will not come
		if !closing {
			w.stats.Reconnects++
		}
		w.mu.Unlock()
		if closing {
			return
		}
		if !subscribed && !retryable(status.Code(err)) {
			w.log.Error("jobbroker: cannot subscribe", "err", err)
			select {
			case fatal <- err:
			default:
			}
		} else {
			w.log.Warn("jobbroker: stream to the broker ended; reconnecting", "err", err, "backoff", backoff)
		}
		select {
		case <-w.closed:
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, w.opts.ReconnectMax)
	}
}

func retryable(c codes.Code) bool {
	switch c {
	case codes.InvalidArgument, codes.Unimplemented, codes.PermissionDenied, codes.Unauthenticated,
		codes.NotFound, codes.FailedPrecondition, codes.OutOfRange, codes.AlreadyExists:
		return false
	}
	return true
}

func leaseGone(code int32) bool {
	return codes.Code(code) == codes.FailedPrecondition || codes.Code(code) == codes.NotFound
}

// onMessage handles one message from the broker. It reports whether the message accepted
// this stream's subscription, and the refusal if it refused it.
func (w *Worker) onMessage(m *pb.WorkResponse) (subscribed bool, refusal error) {
	switch r := m.GetResponse().(type) {
	case *pb.WorkResponse_Job:
		w.onJob(r.Job)
	case *pb.WorkResponse_Result:
		res := r.Result
		w.mu.Lock()
		defer w.mu.Unlock()
		if res.GetRequestId() == w.subscribeID {
			switch codes.Code(res.GetCode()) {
			case codes.OK:
				return true, nil
			case codes.Unavailable: // the broker is stopping: the stream ends, we reconnect
				return false, nil
			default:
				err := status.Error(codes.Code(res.GetCode()), res.GetMessage())
				w.log.Error("jobbroker: subscription refused", "err", err)
				return false, err
			}
		}
		if p, ok := w.pending[res.GetRequestId()]; ok {
			delete(w.pending, res.GetRequestId())
			if hb := p.req.GetHeartbeat(); hb != nil {
				w.onHeartbeatResultLocked(hb.GetJobId(), res)
			} else if res.GetCode() != 0 {
				level := slog.LevelWarn
				if leaseGone(res.GetCode()) {
					level = slog.LevelInfo // the lease ran out: the job runs again elsewhere
				}
				w.log.Log(context.Background(), level, "jobbroker: request refused",
					"code", codes.Code(res.GetCode()).String(), "message", res.GetMessage())
			}
			if p.done != nil {
				p.done <- res
			}
			return false, nil
		}
		if jobID, ok := w.beats[res.GetRequestId()]; ok {
			delete(w.beats, res.GetRequestId())
			w.onHeartbeatResultLocked(jobID, res)
		}
	case *pb.WorkResponse_LeaseLost:
		w.mu.Lock()
		defer w.mu.Unlock()
		if h, ok := w.held[r.LeaseLost.GetJobId()]; ok {
			h.lost = true
			h.cancel(ErrLeaseLost)
		}
	case *pb.WorkResponse_CancelRequested:
		w.mu.Lock()
		defer w.mu.Unlock()
		if h, ok := w.held[r.CancelRequested.GetJobId()]; ok {
			h.cancel(ErrCancelRequested)
		}
	}
	return false, nil
}

func (w *Worker) onHeartbeatResultLocked(jobID string, res *pb.WorkResult) {
	h, ok := w.held[jobID]
	if !ok {
		return
	}
	if leaseGone(res.GetCode()) {
		h.lost = true
		h.cancel(ErrLeaseLost)
	} else if res.GetCancelRequested() {
		h.cancel(ErrCancelRequested)
	}
}

func (w *Worker) onJob(l *pb.LeasedJob) {
	now := time.Now()
	w.mu.Lock()
	if w.stopping { // pushed before our Flow{0} arrived: give it straight back
		r := w.releaseRequestLocked(l)
		w.mu.Unlock()
		w.send(r)
		return
	}
	handler := w.handlers[l.GetQueue()]
	if handler == nil { // cannot happen: we subscribed to our handlers' queues
		r := w.releaseRequestLocked(l)
		w.mu.Unlock()
		w.send(r)
		return
	}
	// Heartbeats follow the lease as granted; the floor guards against clock skew.
	lease := max(l.GetLeaseDeadline().AsTime().Sub(now), 300*time.Millisecond)
	h := &heldJob{
		leased:   l,
		job:      newJob(l),
		lease:    lease,
		nextBeat: now.Add(lease / 3),
		abandon:  make(chan struct{}),
	}
	h.ctx, h.cancel = context.WithCancelCause(w.baseCtx)
	h.job.saveCheckpoint = func(ctx context.Context, cp []byte) error { return w.saveCheckpoint(ctx, h, cp) }
	if old, ok := w.held[l.GetJobId()]; ok { // an older attempt of ours lost its lease
		old.lost = true
		old.cancel(ErrLeaseLost)
	}
	w.held[l.GetJobId()] = h
	w.jobs.Add(1)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	go w.runJob(h, handler)
}

func (w *Worker) runJob(h *heldJob, handler Handler) {
	defer w.jobs.Done()
	select {
	case w.sem <- struct{}{}:
	case <-h.abandon:
		return
	}
	w.mu.Lock()
	if h.released {
		w.mu.Unlock()
		<-w.sem
		return
	}
	if h.lost { // the lease ran out while the job waited for a slot: the broker reruns it
		if w.held[h.leased.GetJobId()] == h {
			delete(w.held, h.leased.GetJobId())
		}
		w.mu.Unlock()
		<-w.sem
		h.cancel(context.Canceled)
		return
	}
	h.started = true
	w.mu.Unlock()

	err := w.callHandler(h, handler)
	<-w.sem
	h.cancel(context.Canceled)

	w.mu.Lock()
	if w.held[h.leased.GetJobId()] == h {
		delete(w.held, h.leased.GetJobId())
	}
	r := &pb.WorkRequest{RequestId: w.newIDLocked()}
	jobID, leaseID := h.leased.GetJobId(), h.leased.GetLeaseId()
	if err == nil {
		w.stats.Acked++
		r.Request = &pb.WorkRequest_Ack{Ack: &pb.AckRequest{JobId: jobID, LeaseId: leaseID, Result: h.job.getResult()}}
	} else {
		w.stats.Failed++
		f := &pb.FailRequest{JobId: jobID, LeaseId: leaseID, Error: err.Error()}
		var perm *PermanentError
		f.Permanent = errors.As(err, &perm)
		var after *RetryAfterError
		if errors.As(err, &after) && after.Delay > 0 {
			f.RetryAfter = durationpb.New(after.Delay)
		}
		r.Request = &pb.WorkRequest_Fail{Fail: f}
	}
	w.pending[r.RequestId] = &pendingReq{req: r}
	w.mu.Unlock()
	w.send(r)
}

func (w *Worker) callHandler(h *heldJob, handler Handler) (err error) {
	defer func() {
		if p := recover(); p != nil {
			w.log.Error("jobbroker: handler panicked", "job_id", h.job.ID, "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("handler panicked: %v", p)
		}
	}()
	return handler(h.ctx, h.job)
}

// saveCheckpoint sends a heartbeat carrying cp and waits for the broker's answer.
func (w *Worker) saveCheckpoint(ctx context.Context, h *heldJob, cp []byte) error {
	done := make(chan *pb.WorkResult, 1)
	w.mu.Lock()
	if w.closing {
		w.mu.Unlock()
		return ErrShutdown
	}
	if h.lost {
		w.mu.Unlock()
		return ErrLeaseLost
	}
	r := &pb.WorkRequest{
		RequestId: w.newIDLocked(),
		Request: &pb.WorkRequest_Heartbeat{Heartbeat: &pb.HeartbeatRequest{
			JobId: h.leased.GetJobId(), LeaseId: h.leased.GetLeaseId(), Checkpoint: cp,
		}},
	}
	w.pending[r.RequestId] = &pendingReq{req: r, done: done}
	h.nextBeat = time.Now().Add(h.lease / 3)
	w.mu.Unlock()
	w.send(r)
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

func (w *Worker) heartbeatLoop() {
	for {
		now := time.Now()
		next := now.Add(time.Second)
		var out []*pb.WorkRequest
		w.mu.Lock()
		for id, h := range w.held {
			if h.lost {
				continue
			}
			if !h.nextBeat.After(now) {
				r := &pb.WorkRequest{
					RequestId: w.newIDLocked(),
					Request: &pb.WorkRequest_Heartbeat{Heartbeat: &pb.HeartbeatRequest{
						JobId: id, LeaseId: h.leased.GetLeaseId(),
					}},
				}
				w.beats[r.RequestId] = id
				h.nextBeat = now.Add(h.lease / 3)
				out = append(out, r)
			}
			if h.nextBeat.Before(next) {
				next = h.nextBeat
			}
		}
		w.mu.Unlock()
		for _, r := range out {
			w.send(r)
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
