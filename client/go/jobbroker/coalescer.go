package jobbroker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "jobbroker.dev/client/go/jobbrokerv1"
)

// Producer coalescing (docs/worker-contract.md §10): concurrent Enqueue calls are merged into
// EnqueueBatch calls, and each caller still gets its own answer. Every job and every call pays
// a commit slot on the broker, whose cost grows with calls, not with jobs, so fewer calls is
// the gain; a lone Enqueue costs what it did, because a batch of one is sent as unary Enqueue.

// The defaults and bounds of the batching options (Options.BatchMaxJobs and friends).
const (
	DefaultBatchMaxJobs     = 100
	DefaultBatchMaxBytes    = 1 << 20
	DefaultBatchMaxInFlight = 4
	// The broker takes at most this many jobs in one EnqueueBatch.
	maxBatchJobs = 1000
)

// batchConfig is Options' batching settings with the defaults filled in.
type batchConfig struct {
	maxJobs     int
	maxBytes    int
	linger      time.Duration
	maxInFlight int
}

// batchConfigOf checks the batching options and fills in the defaults; nil when batching is
// off. The error names the option, as the caller spelled it.
func batchConfigOf(opts Options) (*batchConfig, error) {
	if opts.DisableBatching {
		return nil, nil
	}
	cfg := &batchConfig{
		maxJobs:     opts.BatchMaxJobs,
		maxBytes:    opts.BatchMaxBytes,
		linger:      opts.BatchLinger,
		maxInFlight: opts.BatchMaxInFlight,
	}
	switch {
	case cfg.maxJobs < 0 || cfg.maxJobs > maxBatchJobs:
		return nil, fmt.Errorf("jobbroker: Options.BatchMaxJobs is %d; it must be 1 to %d (0: the default, %d)",
			cfg.maxJobs, maxBatchJobs, DefaultBatchMaxJobs)
	case cfg.maxBytes < 0:
		return nil, fmt.Errorf("jobbroker: Options.BatchMaxBytes is %d; it must be positive (0: the default, %d)",
			cfg.maxBytes, DefaultBatchMaxBytes)
	case cfg.linger < 0:
		return nil, fmt.Errorf("jobbroker: Options.BatchLinger is %v; it must not be negative", cfg.linger)
	case cfg.maxInFlight < 0:
		return nil, fmt.Errorf("jobbroker: Options.BatchMaxInFlight is %d; it must be positive (0: the default, %d)",
			cfg.maxInFlight, DefaultBatchMaxInFlight)
	}
	if cfg.maxJobs == 0 {
		cfg.maxJobs = DefaultBatchMaxJobs
	}
	if cfg.maxBytes == 0 {
		cfg.maxBytes = DefaultBatchMaxBytes
	}
	if cfg.maxInFlight == 0 {
		cfg.maxInFlight = DefaultBatchMaxInFlight
	}
	return cfg, nil
}

// sendJobsFunc sends jobs as one call: unary Enqueue for one job, EnqueueBatch for more. It
// returns one result per job, in order.
type sendJobsFunc func(ctx context.Context, jobs []*pb.EnqueueRequest) ([]Enqueued, error)

// coalescer holds, per key, the open batch that jobs join, the batches that are ready but wait
// for a free slot, and how many of the key's batches are in flight. Goroutines are the threaded
// case of §10: the caller sends the batch its job is in at once when a slot is free (with a
// linger of 0), else the batch waits and is sent by whichever goroutine ends an in-flight batch
// of its key; with a linger, a timer per batch (not per job) sends it.
type coalescer struct {
	// Constant after construction.
	cfg             batchConfig
	defaultDeadline time.Duration // < 0: none
	send            sendJobsFunc
	// The partition count of the cluster's layout the client holds, 0 when it holds none.
	partitions func() uint32

	mu     sync.Mutex
	keys   map[batchKey]*keyState
	closed bool
	// Counts the batches opened and not yet answered, for close.
	pending sync.WaitGroup
}

// batchKey is what jobs must share to go in one batch. By partition, so that a batch never spans
// partitions (the broker refuses that); by queue when the partition count is unknown. By whether
// the jobs have a dedup key, so that a batch is retried on Unavailable exactly when each of its
// jobs would have been alone. By the caller's outgoing gRPC metadata, because one call carries
// one set (a per-call token must not send another caller's job).
type batchKey struct {
	partition uint32
	queue     string
	dedup     bool
	metadata  string
}

type keyState struct {
	open     *batch   // jobs join it; nil when none
	ready    []*batch // full or due, waiting for a slot, in the order they closed
	inFlight int
}

// batch is the jobs of one call and, once done is closed, their answers.
type batch struct {
	key batchKey
	// The first caller's context, without its cancellation: its values (metadata) go with the
	// call, while a caller that gives up leaves its job in the batch (§10).
	ctx       context.Context
	jobs      []*pb.EnqueueRequest
	deadlines []time.Time // each caller's; zero: none
	bytes     int
	// May be sent as soon as a slot is free: the linger is over (or 0), or it is full.
	due   bool
	timer *time.Timer

	done    chan struct{}
	results []Enqueued
	errs    []error // nil when every job succeeded
}

func newCoalescer(cfg batchConfig, defaultDeadline time.Duration, send sendJobsFunc, partitions func() uint32) *coalescer {
	return &coalescer{
		cfg:             cfg,
		defaultDeadline: defaultDeadline,
		send:            send,
		partitions:      partitions,
		keys:            map[batchKey]*keyState{},
	}
}

// enqueue sends job in a batch of its key and returns its own answer.
func (co *coalescer) enqueue(ctx context.Context, job *pb.EnqueueRequest) (Enqueued, error) {
	if ctx.Err() != nil { // as gRPC does, a call already cancelled sends nothing
		return Enqueued{}, status.FromContextError(ctx.Err()).Err()
	}
	key := co.keyOf(ctx, job)
	var deadline time.Time
	if d, ok := ctx.Deadline(); ok {
		deadline = d
	} else if co.defaultDeadline > 0 {
		deadline = time.Now().Add(co.defaultDeadline)
	}
	b, index, sendNow, sendToo := co.add(ctx, key, job, deadline)
	if b == nil { // closed: the call fails as any call on a closed client does
		results, err := co.send(ctx, []*pb.EnqueueRequest{job})
		if err != nil {
			return Enqueued{}, err
		}
		return results[0], nil
	}
	if sendToo != nil {
		go co.run(sendToo, true)
	}
	if sendNow != nil {
		co.run(sendNow, false) // its batch: this goroutine waits for it anyway
	}
	select {
	case <-b.done:
	case <-ctx.Done():
		select {
		case <-b.done: // answered as well: the answer says more
		default:
			return Enqueued{}, status.FromContextError(ctx.Err()).Err()
		}
	}
	if b.errs != nil && b.errs[index] != nil {
		return Enqueued{}, b.errs[index]
	}
	return b.results[index], nil
}

func (co *coalescer) keyOf(ctx context.Context, job *pb.EnqueueRequest) batchKey {
	key := batchKey{dedup: job.GetDedupKey() != "", metadata: metadataKey(ctx)}
	if n := co.partitions(); n > 0 {
		key.partition = partitionOfQueue(job.GetQueue(), n)
	} else {
		key.queue = job.GetQueue()
	}
	return key
}

// metadataKey is the outgoing metadata of ctx in a canonical form; "" for none, the usual case.
func metadataKey(ctx context.Context) string {
	md, ok := metadata.FromOutgoingContext(ctx)
	if !ok || md.Len() == 0 {
		return ""
	}
	var sb strings.Builder
	for _, k := range slices.Sorted(maps.Keys(md)) {
		sb.WriteString(k)
		for _, v := range md[k] {
			sb.WriteByte(0)
			sb.WriteString(v)
		}
		sb.WriteByte('\n')
	}
	return sb.String()
}

// jobBytes is what a job counts toward BatchMaxBytes: its payload and its headers' names and
// values, the bulk of the request.
func jobBytes(job *pb.EnqueueRequest) int {
	n := len(job.GetPayload())
	for k, v := range job.GetHeaders() {
		n += len(k) + len(v)
	}
	return n
}

// add puts job in the open batch of key (rules 1 and 2 of §10) and returns that batch and the
// job's place in it. sendNow is its batch when the caller is to send it now; sendToo is an
// earlier batch that this job closed (it would have passed BatchMaxBytes) and that may be sent
// at once too. b is nil once the coalescer is closed.
func (co *coalescer) add(ctx context.Context, key batchKey, job *pb.EnqueueRequest, deadline time.Time) (b *batch, index int, sendNow, sendToo *batch) {
	size := jobBytes(job)
	co.mu.Lock()
	defer co.mu.Unlock()
	if co.closed {
		return nil, 0, nil, nil
	}
	ks := co.keys[key]
	if ks == nil {
		ks = &keyState{}
		co.keys[key] = ks
	}
	// A job that would take the open batch past the byte limit goes in the next one, so that a
	// batch stays within the limit unless one job alone is larger.
	if ks.open != nil && ks.open.bytes+size > co.cfg.maxBytes {
		sendToo = co.closeOpenLocked(ks)
	}
	if ks.open == nil {
		ks.open = co.newBatchLocked(ctx, key)
	}
	b = ks.open
	index = len(b.jobs)
	b.jobs = append(b.jobs, job)
	b.deadlines = append(b.deadlines, deadline)
	b.bytes += size
	full := len(b.jobs) >= co.cfg.maxJobs || b.bytes >= co.cfg.maxBytes
	// A due batch that finds no free slot stays open: later jobs join it while it waits.
	if full || (b.due && ks.inFlight < co.cfg.maxInFlight && len(ks.ready) == 0) {
		sendNow = co.closeOpenLocked(ks)
	}
	return b, index, sendNow, sendToo
}

func (co *coalescer) newBatchLocked(ctx context.Context, key batchKey) *batch {
	b := &batch{key: key, ctx: context.WithoutCancel(ctx), done: make(chan struct{})}
	co.pending.Add(1)
	if co.cfg.linger > 0 {
		b.timer = time.AfterFunc(co.cfg.linger, func() { co.lingerOver(b) })
	} else {
		b.due = true // threaded, linger 0: sent at once when a slot is free (rule 3)
	}
	return b
}

// closeOpenLocked closes the key's open batch to more jobs and returns it when a slot is free
// (the caller sends it); otherwise it waits in ks.ready for one (rule 4).
func (co *coalescer) closeOpenLocked(ks *keyState) *batch {
	b := ks.open
	ks.open = nil
	b.due = true
	if b.timer != nil {
		b.timer.Stop() // a timer that fires anyway finds the batch no longer open
	}
	if ks.inFlight < co.cfg.maxInFlight && len(ks.ready) == 0 {
		ks.inFlight++
		return b
	}
	ks.ready = append(ks.ready, b)
	return nil
}

// lingerOver is a batch's timer: the batch is sent now if a slot is free; otherwise it is due,
// and the end of an in-flight batch of its key sends it.
func (co *coalescer) lingerOver(b *batch) {
	co.mu.Lock()
	ks := co.keys[b.key]
	if ks == nil || ks.open != b {
		co.mu.Unlock()
		return
	}
	b.due = true
	send := ks.inFlight < co.cfg.maxInFlight && len(ks.ready) == 0
	if send {
		ks.open = nil
		ks.inFlight++
	}
	co.mu.Unlock()
	if send {
		co.run(b, true)
	}
}

// run sends b and answers its callers, then frees its slot, which sends the next batch of its
// key if one is waiting. own: the goroutine is the coalescer's (a timer's, or one it started),
// so it goes on to send that next batch itself; a caller's goroutine hands it to a new one and
// returns to its caller.
func (co *coalescer) run(b *batch, own bool) {
	for b != nil {
		co.answer(b)
		next := co.finished(b.key)
		co.pending.Done()
		if next != nil && !own {
			go co.run(next, true)
			return
		}
		b = next
	}
}

// finished frees a slot of key and takes the batch to send next, if any: the oldest ready one,
// else the open one if it is due.
func (co *coalescer) finished(key batchKey) *batch {
	co.mu.Lock()
	defer co.mu.Unlock()
	ks := co.keys[key]
	ks.inFlight--
	var next *batch
	switch {
	case len(ks.ready) > 0:
		next = ks.ready[0]
		ks.ready[0] = nil
		ks.ready = ks.ready[1:]
	case ks.open != nil && ks.open.due:
		next = ks.open
		ks.open = nil
	case ks.open == nil && ks.inFlight == 0:
		delete(co.keys, key) // a key per queue or partition ever used would otherwise stay
		return nil
	default:
		return nil
	}
	ks.inFlight++
	return next
}

// refusedWhole are the codes with which the broker refuses a batch without applying any of it:
// each job is then sent again alone, so that only a bad job fails, with a unary call's message.
// Any other error (Unavailable after the retries, DeadlineExceeded, Internal, ...) may come
// after the batch was applied, and is every caller's.
var refusedWhole = map[codes.Code]bool{
	codes.InvalidArgument: true, codes.ResourceExhausted: true, codes.AlreadyExists: true,
	codes.FailedPrecondition: true, codes.NotFound: true, codes.OutOfRange: true,
	codes.PermissionDenied: true,
}

// answer sends b, as one call bounded by its callers' earliest deadline (rule 6), and fills in
// its answers (§10 "Answers").
func (co *coalescer) answer(b *batch) {
	defer close(b.done)
	ctx := b.ctx
	if deadline := earliest(b.deadlines); !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	results, err := co.send(ctx, b.jobs)
	if err == nil && len(results) != len(b.jobs) {
		err = status.Errorf(codes.Internal, "jobbroker: the broker answered %d results for a batch of %d jobs", len(results), len(b.jobs))
	}
	switch {
	case err == nil:
		b.results = results
	case len(b.jobs) > 1 && refusedWhole[status.Code(err)]:
		co.sendEachAlone(b)
	default:
		b.errs = make([]error, len(b.jobs))
		for i := range b.errs {
			b.errs[i] = err
		}
	}
}

// sendEachAlone sends the jobs of a refused batch again as unary calls, all at once, each
// bounded by its own caller's deadline.
func (co *coalescer) sendEachAlone(b *batch) {
	b.results = make([]Enqueued, len(b.jobs))
	b.errs = make([]error, len(b.jobs))
	var wg sync.WaitGroup
	for i, job := range b.jobs {
		wg.Go(func() {
			ctx := b.ctx
			if !b.deadlines[i].IsZero() {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, b.deadlines[i])
				defer cancel()
			}
			results, err := co.send(ctx, []*pb.EnqueueRequest{job})
			if err == nil && len(results) != 1 {
				err = errors.New("jobbroker: the broker answered no result for a job")
			}
			if err != nil {
				b.errs[i] = err
				return
			}
			b.results[i] = results[0]
		})
	}
	wg.Wait()
}

func earliest(deadlines []time.Time) time.Time {
	var out time.Time
	for _, d := range deadlines {
		if !d.IsZero() && (out.IsZero() || d.Before(out)) {
			out = d
		}
	}
	return out
}

// close sends the open batches (each as soon as its key has a free slot) and waits until every
// batch has been answered. Enqueue calls after it are sent alone.
func (co *coalescer) close() {
	co.mu.Lock()
	co.closed = true
	var now []*batch
	for _, ks := range co.keys {
		if ks.open == nil {
			continue
		}
		if b := co.closeOpenLocked(ks); b != nil {
			now = append(now, b)
		}
	}
	co.mu.Unlock()
	for _, b := range now {
		go co.run(b, true)
	}
	co.pending.Wait()
}
