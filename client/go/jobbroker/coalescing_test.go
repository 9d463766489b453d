package jobbroker_test

// Enqueue coalescing (docs/worker-contract.md §10) against the real broker: what the callers
// get, and how many calls the broker saw (its jobbroker_rpc_duration_seconds_count). Each test
// has a broker of its own, so that no other test's calls count.

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	"jobbroker.dev/client/go/jobbroker"
	pb "jobbroker.dev/client/go/jobbrokerv1"
)

const (
	enqueueMethod      = "/jobbroker.v1.Broker/Enqueue"
	enqueueBatchMethod = "/jobbroker.v1.Broker/EnqueueBatch"
)

func ownBroker(t *testing.T, extra ...string) *testBroker {
	t.Helper()
	b, err := startBroker("", "127.0.0.1:0", "", extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.stop)
	return b
}

// rpcCount is the broker's count of calls of method ended with code ("": any code).
func rpcCount(t *testing.T, b *testBroker, method, code string) int {
	t.Helper()
	resp, err := http.Get("http://" + b.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	total := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "jobbroker_rpc_duration_seconds_count{") ||
			!strings.Contains(line, `method="`+method+`"`) ||
			(code != "" && !strings.Contains(line, `code="`+code+`"`)) {
			continue
		}
		value, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		total += int(value)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return total
}

// enqueueCalls is the broker's count of Enqueue and EnqueueBatch calls so far.
type enqueueCalls struct{ unary, batch int }

func enqueueCallsOf(t *testing.T, b *testBroker) enqueueCalls {
	return enqueueCalls{rpcCount(t, b, enqueueMethod, ""), rpcCount(t, b, enqueueBatchMethod, "")}
}

// waitCalls waits until the broker has counted at least want more calls than before: the
// broker counts a call as it ends, which may come just after the client has its answer.
func waitCalls(t *testing.T, b *testBroker, before enqueueCalls, want int) enqueueCalls {
	t.Helper()
	var now enqueueCalls
	waitFor(t, fmt.Sprintf("%d enqueue calls to be counted", want), func() bool {
		now = enqueueCallsOf(t, b)
		return now.unary+now.batch-before.unary-before.batch >= want
	})
	return now
}

type enqueueOutcome struct {
	result jobbroker.Enqueued
	err    error
}

// concurrently runs n calls of enqueue at once (released together once all have started) and
// returns their outcomes by index.
func concurrently(n int, enqueue func(i int) (jobbroker.Enqueued, error)) []enqueueOutcome {
	out := make([]enqueueOutcome, n)
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			out[i].result, out[i].err = enqueue(i)
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
	return out
}

// checkCreated fails unless every outcome is a success whose job exists with the payload its
// caller sent (payload(i)): each caller got its own job's answer.
func checkCreated(t *testing.T, c *jobbroker.Client, outcomes []enqueueOutcome, payload func(i int) string) {
	t.Helper()
	ids := map[string]bool{}
	for i, o := range outcomes {
		if o.err != nil {
			t.Fatalf("enqueue %d: %v", i, o.err)
		}
		ids[o.result.JobID] = true
		job, err := c.GetJob(testCtx(t), o.result.JobID)
		if err != nil {
			t.Fatalf("GetJob of enqueue %d: %v", i, err)
		}
		if string(job.GetPayload()) != payload(i) {
			t.Fatalf("enqueue %d answered job %s, whose payload is %q, not its own %q",
				i, o.result.JobID, job.GetPayload(), payload(i))
		}
	}
	if len(ids) != len(outcomes) {
		t.Fatalf("%d enqueues answered %d distinct job ids", len(outcomes), len(ids))
	}
}

func payloadOf(i int) string { return "job-" + strconv.Itoa(i) }

func TestConcurrentEnqueuesWithALingerAreSentInFewBatches(t *testing.T) {
	b := ownBroker(t)
	var middlewareCalls atomic.Int64
	counting := func(next jobbroker.EnqueueFunc) jobbroker.EnqueueFunc {
		return func(ctx context.Context, jobs []*pb.EnqueueRequest) ([]jobbroker.Enqueued, error) {
			if len(jobs) != 1 {
				t.Errorf("the middleware of one Enqueue saw %d jobs", len(jobs))
			}
			middlewareCalls.Add(1)
			return next(ctx, jobs)
		}
	}
	c := newClientWith(t, jobbroker.Options{
		Address:           b.addr,
		BatchLinger:       50 * time.Millisecond,
		EnqueueMiddleware: []jobbroker.EnqueueMiddleware{counting},
	})
	ctx, q := testCtx(t), queueFor(t)
	before := enqueueCallsOf(t, b)
	outcomes := concurrently(200, func(i int) (jobbroker.Enqueued, error) {
		return c.Enqueue(ctx, q, []byte(payloadOf(i)))
	})
	checkCreated(t, c, outcomes, payloadOf)
	if n := middlewareCalls.Load(); n != 200 {
		t.Fatalf("the middleware ran %d times for 200 Enqueue calls, want once per call", n)
	}
	after := waitCalls(t, b, before, 1)
	calls := after.unary + after.batch - before.unary - before.batch
	t.Logf("200 enqueues: %d Enqueue and %d EnqueueBatch calls", after.unary-before.unary, after.batch-before.batch)
	if calls > 100 || after.batch == before.batch {
		t.Fatalf("200 concurrent enqueues took %d Enqueue and %d EnqueueBatch calls; want at most 100 in all, one EnqueueBatch at least",
			after.unary-before.unary, after.batch-before.batch)
	}
}

func TestConcurrentEnqueuesWithTheDefaultsTakeFewerCalls(t *testing.T) {
	b := ownBroker(t)
	c := newClientWith(t, jobbroker.Options{Address: b.addr})
	ctx, q := testCtx(t), queueFor(t)
	before := enqueueCallsOf(t, b)
	outcomes := concurrently(200, func(i int) (jobbroker.Enqueued, error) {
		return c.Enqueue(ctx, q, []byte(payloadOf(i)))
	})
	checkCreated(t, c, outcomes, payloadOf)
	after := waitCalls(t, b, before, 1)
	t.Logf("200 enqueues: %d Enqueue and %d EnqueueBatch calls", after.unary-before.unary, after.batch-before.batch)
	if calls := after.unary + after.batch - before.unary - before.batch; calls >= 200 {
		t.Fatalf("200 concurrent enqueues took %d calls, want fewer than 200", calls)
	}
}

func TestABadJobInABatchFailsOnlyItsOwnCall(t *testing.T) {
	b := ownBroker(t)
	c := newClientWith(t, jobbroker.Options{Address: b.addr, BatchLinger: 50 * time.Millisecond})
	ctx, q := testCtx(t), queueFor(t)
	refusedBefore := rpcCount(t, b, enqueueBatchMethod, "INVALID_ARGUMENT")
	const bad = 17
	outcomes := concurrently(50, func(i int) (jobbroker.Enqueued, error) {
		var opts []jobbroker.EnqueueOption
		if i == bad {
			opts = append(opts, jobbroker.WithHeader("", "no name"))
		}
		return c.Enqueue(ctx, q, []byte(payloadOf(i)), opts...)
	})
	err := outcomes[bad].err
	if !jobbroker.IsInvalidArgument(err) {
		t.Fatalf("the job with an empty header name: %v, want InvalidArgument", err)
	}
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "headers") || strings.Contains(msg, "jobs[") {
		t.Fatalf("its message %q should name headers as a unary Enqueue does, without the batch's jobs[i]", msg)
	}
	good := slices.Delete(slices.Clone(outcomes), bad, bad+1)
	checkCreated(t, c, good, func(i int) string {
		if i >= bad {
			i++
		}
		return payloadOf(i)
	})
	waitFor(t, "the refused EnqueueBatch to be counted", func() bool {
		return rpcCount(t, b, enqueueBatchMethod, "INVALID_ARGUMENT") > refusedBefore
	})
}

func TestBatchingCanBeTurnedOffForACallOrAClient(t *testing.T) {
	b := ownBroker(t)
	ctx, q := testCtx(t), queueFor(t)

	c := newClientWith(t, jobbroker.Options{Address: b.addr})
	before := enqueueCallsOf(t, b)
	if _, err := c.Enqueue(ctx, q, []byte("alone"), jobbroker.WithoutBatching()); err != nil {
		t.Fatal(err)
	}
	after := waitCalls(t, b, before, 1)
	if after.unary != before.unary+1 || after.batch != before.batch {
		t.Fatalf("an Enqueue WithoutBatching took %d Enqueue and %d EnqueueBatch calls, want 1 and 0",
			after.unary-before.unary, after.batch-before.batch)
	}

	off := newClientWith(t, jobbroker.Options{Address: b.addr, DisableBatching: true})
	before = after
	outcomes := concurrently(20, func(i int) (jobbroker.Enqueued, error) {
		return off.Enqueue(ctx, q, []byte(payloadOf(i)))
	})
	checkCreated(t, off, outcomes, payloadOf)
	after = waitCalls(t, b, before, 20)
	if after.unary != before.unary+20 || after.batch != before.batch {
		t.Fatalf("20 concurrent enqueues with DisableBatching took %d Enqueue and %d EnqueueBatch calls, want 20 and 0",
			after.unary-before.unary, after.batch-before.batch)
	}
}

func TestConcurrentEnqueuesOfOneDedupKeyGetOneJob(t *testing.T) {
	b := ownBroker(t)
	c := newClientWith(t, jobbroker.Options{Address: b.addr})
	ctx, q := testCtx(t), queueFor(t)
	outcomes := concurrently(20, func(int) (jobbroker.Enqueued, error) {
		return c.Enqueue(ctx, q, []byte("same"), jobbroker.WithDedupKey("the-key"))
	})
	created := 0
	for i, o := range outcomes {
		if o.err != nil {
			t.Fatalf("enqueue %d: %v", i, o.err)
		}
		if o.result.JobID != outcomes[0].result.JobID {
			t.Fatalf("enqueues of one dedup key answered jobs %s and %s", outcomes[0].result.JobID, o.result.JobID)
		}
		if !o.result.Deduplicated {
			created++
		}
	}
	if created != 1 {
		t.Fatalf("%d of 20 enqueues of one dedup key were not marked deduplicated, want 1", created)
	}
}

func TestBatchesNeverSpanPartitions(t *testing.T) {
	const partitions = 4
	b := ownBroker(t, "--partitions", strconv.Itoa(partitions))
	// A linger so that jobs of several queues meet: each batch is then of one partition only.
	c := newClientWith(t, jobbroker.Options{Address: b.addr, BatchLinger: 50 * time.Millisecond})
	ctx, base := testCtx(t), queueFor(t)
	var queues []string
	perPartition := map[uint32]int{}
	for i := 0; len(queues) < 8; i++ {
		q := fmt.Sprintf("%s.%d", base, i)
		if p := jobbroker.PartitionOfQueue(q, partitions); perPartition[p] < 2 {
			perPartition[p]++
			queues = append(queues, q)
		}
	}
	// The client learns the partition count with its first call.
	if _, err := c.Enqueue(ctx, queues[0], []byte("first")); err != nil {
		t.Fatal(err)
	}
	before := enqueueCallsOf(t, b)
	payload := func(i int) string { return queues[i%len(queues)] + "/" + payloadOf(i) }
	outcomes := concurrently(8*25, func(i int) (jobbroker.Enqueued, error) {
		return c.Enqueue(ctx, queues[i%len(queues)], []byte(payload(i)))
	})
	for i, o := range outcomes {
		if o.err != nil {
			t.Fatalf("enqueue %d to %s (partition %d): %v", i, queues[i%len(queues)],
				jobbroker.PartitionOfQueue(queues[i%len(queues)], partitions), o.err)
		}
	}
	checkCreated(t, c, outcomes, payload)
	after := waitCalls(t, b, before, 1)
	if after.batch == before.batch {
		t.Fatalf("200 enqueues over 8 queues took no EnqueueBatch")
	}
}

// newRefuses checks that New refuses opts (given the shared broker's address) with an error
// naming the option `name`.
func newRefuses(t *testing.T, opts jobbroker.Options, name string) {
	t.Helper()
	opts.Address = shared.addr
	c, err := jobbroker.New(opts)
	if err == nil {
		c.Close()
		t.Fatalf("New(%+v) accepted the options", opts)
	}
	if !strings.Contains(err.Error(), name) {
		t.Fatalf("New with a bad %s: %q does not name it", name, err)
	}
}

func TestBatchingOptionsOutOfRangeAreRefused(t *testing.T) {
	cases := []struct {
		opts jobbroker.Options
		name string
	}{
		{jobbroker.Options{BatchMaxJobs: 1001}, "BatchMaxJobs"},
		{jobbroker.Options{BatchMaxJobs: -1}, "BatchMaxJobs"},
		{jobbroker.Options{BatchMaxBytes: -1}, "BatchMaxBytes"},
		{jobbroker.Options{BatchLinger: -time.Millisecond}, "BatchLinger"},
		{jobbroker.Options{BatchMaxInFlight: -1}, "BatchMaxInFlight"},
	}
	for _, tc := range cases {
		newRefuses(t, tc.opts, tc.name)
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), tc.name) {
					t.Fatalf("NewClientFromConn with a bad %s: panic %v, want one naming it", tc.name, r)
				}
			}()
			jobbroker.NewClientFromConn(nil, tc.opts)
		}()
	}
	// The bounds themselves, and 0 for the defaults, are fine.
	for _, opts := range []jobbroker.Options{
		{BatchMaxJobs: 1, BatchMaxBytes: 1, BatchMaxInFlight: 1},
		{BatchMaxJobs: 1000, BatchLinger: time.Second},
		{},
	} {
		opts.Address = shared.addr
		c, err := jobbroker.New(opts)
		if err != nil {
			t.Fatalf("New(%+v): %v", opts, err)
		}
		c.Close()
	}
}

func TestCloseSendsTheOpenBatches(t *testing.T) {
	b := ownBroker(t)
	c, err := jobbroker.New(jobbroker.Options{Address: b.addr, BatchLinger: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, q := testCtx(t), queueFor(t)
	outcomes := make(chan enqueueOutcome, 5)
	for i := range 5 {
		go func() {
			r, err := c.Enqueue(ctx, q, []byte(payloadOf(i)))
			outcomes <- enqueueOutcome{r, err}
		}()
	}
	// Nothing is sent within the linger of an hour: the jobs wait in the open batch...
	admin := newClientWith(t, jobbroker.Options{Address: b.addr})
	before := enqueueCallsOf(t, b)
	waitFor(t, "the 5 jobs to join the open batch", func() bool {
		return jobbroker.WaitingEnqueues(c) == 5
	})
	// ...until Close sends them, and returns once they are answered.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if len(outcomes) != 5 {
		t.Fatalf("Close returned with %d of 5 enqueues answered", len(outcomes))
	}
	if after := waitCalls(t, b, before, 1); after.batch != before.batch+1 || after.unary != before.unary {
		t.Fatalf("Close sent %d EnqueueBatch and %d Enqueue calls, want the one batch",
			after.batch-before.batch, after.unary-before.unary)
	}
	for range 5 {
		if o := <-outcomes; o.err != nil {
			t.Fatalf("an enqueue sent by Close: %v", o.err)
		}
	}
	info, err := admin.GetQueue(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if n := info.GetCounts()[pb.JobState_JOB_STATE_READY.String()]; n != 5 {
		t.Fatalf("the queue holds %d ready jobs after Close, want 5", n)
	}
}
