package jobbroker

// The coalescer's rules (docs/worker-contract.md §10) with a stubbed sender: which jobs go in
// which call, in what order, how many calls at once. Inside the package, so that jobs can be
// added one after the other from one goroutine, which fixes their order.

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "jobbroker.dev/client/go/jobbrokerv1"
)

// stubSender records the calls the coalescer sends (each as its jobs' payloads) and answers
// each job with its payload as the job id. While hold is open, calls wait for it to close.
type stubSender struct {
	hold chan struct{}
	// refuse, if set, is the error of a call, or nil.
	refuse func(jobs []*pb.EnqueueRequest) error

	mu          sync.Mutex
	calls       [][]string
	deadlines   []time.Time
	inFlight    int
	maxInFlight int
}

func (s *stubSender) send(ctx context.Context, jobs []*pb.EnqueueRequest) ([]Enqueued, error) {
	var payloads []string
	for _, j := range jobs {
		payloads = append(payloads, string(j.GetPayload()))
	}
	deadline, _ := ctx.Deadline()
	s.mu.Lock()
	s.calls = append(s.calls, payloads)
	s.deadlines = append(s.deadlines, deadline)
	s.inFlight++
	s.maxInFlight = max(s.maxInFlight, s.inFlight)
	s.mu.Unlock()
	if s.hold != nil {
		<-s.hold
	}
	s.mu.Lock()
	s.inFlight--
	s.mu.Unlock()
	if s.refuse != nil {
		if err := s.refuse(jobs); err != nil {
			return nil, err
		}
	}
	out := make([]Enqueued, len(jobs))
	for i, p := range payloads {
		out[i] = Enqueued{JobID: p}
	}
	return out, nil
}

func (s *stubSender) recorded() (calls [][]string, maxInFlight int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls), s.maxInFlight
}

func testCoalescer(cfg batchConfig, s *stubSender) *coalescer {
	if cfg.maxBytes == 0 {
		cfg.maxBytes = DefaultBatchMaxBytes
	}
	return newCoalescer(cfg, -1, s.send, func() uint32 { return 0 })
}

// pendingJob is a job added to the coalescer and the batch that answers it.
type pendingJob struct {
	b     *batch
	index int
}

// addInOrder adds a job per payload, one after the other, and starts the sends the coalescer
// asks its callers to make, as enqueue does.
func addInOrder(co *coalescer, payloads []string, opts ...EnqueueOption) []pendingJob {
	var out []pendingJob
	for _, p := range payloads {
		job := NewEnqueueRequest("q", []byte(p), opts...)
		ctx := context.Background()
		b, index, sendNow, sendToo := co.add(ctx, co.keyOf(ctx, job), job, time.Time{})
		for _, s := range []*batch{sendToo, sendNow} {
			if s != nil {
				go co.run(s, false)
			}
		}
		out = append(out, pendingJob{b, index})
	}
	return out
}

func payloads(from, to int) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, "j"+strconv.Itoa(i))
	}
	return out
}

func waitAnswered(t *testing.T, jobs []pendingJob) {
	t.Helper()
	for _, j := range jobs {
		select {
		case <-j.b.done:
		case <-time.After(30 * time.Second):
			t.Fatal("a job was never answered")
		}
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestBatchesHoldAtMostBatchMaxJobsInCallOrder(t *testing.T) {
	s := &stubSender{hold: make(chan struct{})}
	co := testCoalescer(batchConfig{maxJobs: 10, maxInFlight: 1}, s)
	jobs := addInOrder(co, payloads(0, 35))
	// The first job went alone at once; the others wait for its slot, in batches of 10.
	waitUntil(t, "the first call", func() bool { calls, _ := s.recorded(); return len(calls) == 1 })
	close(s.hold)
	waitAnswered(t, jobs)
	calls, maxInFlight := s.recorded()
	want := [][]string{payloads(0, 1), payloads(1, 11), payloads(11, 21), payloads(21, 31), payloads(31, 35)}
	if !slices.EqualFunc(calls, want, slices.Equal) {
		t.Fatalf("calls %v, want %v", calls, want)
	}
	if maxInFlight != 1 {
		t.Fatalf("%d calls in flight at once, want 1", maxInFlight)
	}
	for i, j := range jobs {
		if got := j.b.results[j.index].JobID; got != "j"+strconv.Itoa(i) || j.b.errs != nil {
			t.Fatalf("job %d answered %q (errors %v)", i, got, j.b.errs)
		}
	}
}

func TestABatchStaysWithinBatchMaxBytes(t *testing.T) {
	s := &stubSender{hold: make(chan struct{})}
	co := testCoalescer(batchConfig{maxJobs: 100, maxBytes: 100, maxInFlight: 1}, s)
	p40 := strings.Repeat("a", 40)
	var jobs []pendingJob
	jobs = append(jobs, addInOrder(co, []string{"0" + p40[1:]})...) // alone, in flight
	// 40 + 40 bytes; a third would pass 100: the batch closes before it.
	jobs = append(jobs, addInOrder(co, []string{"1" + p40[1:], "2" + p40[1:], "3" + p40[1:], "4" + p40[1:]})...)
	// Headers count: 40 + 1 + 58 = 99 bytes, which does not fit with 80.
	jobs = append(jobs, addInOrder(co, []string{"5" + p40[1:]}, WithHeader("h", strings.Repeat("v", 58)))...)
	// 1 byte more reaches 100: the batch is full and closes.
	jobs = append(jobs, addInOrder(co, []string{"6"})...)
	close(s.hold)
	waitAnswered(t, jobs)
	calls, _ := s.recorded()
	var firsts [][]byte
	for _, c := range calls {
		var f []byte
		for _, p := range c {
			f = append(f, p[0])
		}
		firsts = append(firsts, f)
	}
	want := [][]byte{[]byte("0"), []byte("12"), []byte("34"), []byte("56")}
	if !slices.EqualFunc(firsts, want, slices.Equal) {
		t.Fatalf("calls (by first payload byte) %q, want %q", firsts, want)
	}
}

func TestNoMoreThanBatchMaxInFlightBatchesOfAKeyAreOut(t *testing.T) {
	s := &stubSender{hold: make(chan struct{})}
	co := testCoalescer(batchConfig{maxJobs: 5, maxInFlight: 3}, s)
	var wg sync.WaitGroup
	answers := make([]Enqueued, 100)
	errs := make([]error, 100)
	for i := range 100 {
		wg.Go(func() {
			answers[i], errs[i] = co.enqueue(context.Background(), NewEnqueueRequest("q", []byte("j"+strconv.Itoa(i))))
		})
	}
	// Three calls go out; every other job waits, whatever the order the goroutines ran in.
	waitUntil(t, "3 calls out and the 97 other jobs waiting", func() bool {
		calls, _ := s.recorded()
		co.mu.Lock()
		defer co.mu.Unlock()
		waiting := 0
		for _, ks := range co.keys {
			if ks.open != nil {
				waiting += len(ks.open.jobs)
			}
			for _, b := range ks.ready {
				waiting += len(b.jobs)
			}
		}
		return len(calls) == 3 && waiting == 97
	})
	close(s.hold)
	wg.Wait()
	calls, maxInFlight := s.recorded()
	if maxInFlight != 3 {
		t.Fatalf("%d calls were in flight at once, want 3 (BatchMaxInFlight)", maxInFlight)
	}
	sent := 0
	for _, c := range calls {
		if len(c) > 5 {
			t.Fatalf("a call of %d jobs, above BatchMaxJobs 5", len(c))
		}
		sent += len(c)
	}
	if sent != 100 {
		t.Fatalf("%d jobs sent, want 100", sent)
	}
	for i := range 100 {
		if errs[i] != nil || answers[i].JobID != "j"+strconv.Itoa(i) {
			t.Fatalf("enqueue %d = %v, %v", i, answers[i], errs[i])
		}
	}
	co.mu.Lock()
	defer co.mu.Unlock()
	if len(co.keys) != 0 {
		t.Fatalf("%d keys left after every batch ended", len(co.keys))
	}
}

func TestALingerHoldsTheBatchUntilCloseSendsIt(t *testing.T) {
	s := &stubSender{}
	co := testCoalescer(batchConfig{maxJobs: 100, linger: time.Hour, maxInFlight: 4}, s)
	jobs := addInOrder(co, payloads(0, 5))
	if calls, _ := s.recorded(); len(calls) != 0 {
		t.Fatalf("calls %v before the linger ended", calls)
	}
	co.close()
	for _, j := range jobs {
		select {
		case <-j.b.done:
		default:
			t.Fatal("close returned before a job was answered")
		}
	}
	if calls, _ := s.recorded(); !slices.EqualFunc(calls, [][]string{payloads(0, 5)}, slices.Equal) {
		t.Fatalf("calls %v, want the one batch", calls)
	}
	// After close, a job goes alone.
	if _, err := co.enqueue(context.Background(), NewEnqueueRequest("q", []byte("late"))); err != nil {
		t.Fatal(err)
	}
	if calls, _ := s.recorded(); len(calls) != 2 || len(calls[1]) != 1 {
		t.Fatalf("calls %v, want the late job alone", calls)
	}
}

func TestALingerSendsTheBatchByItsTimer(t *testing.T) {
	s := &stubSender{}
	co := testCoalescer(batchConfig{maxJobs: 100, linger: time.Millisecond, maxInFlight: 4}, s)
	jobs := addInOrder(co, payloads(0, 3))
	waitAnswered(t, jobs)
	sent := 0
	calls, _ := s.recorded()
	for _, c := range calls {
		sent += len(c)
	}
	if sent != 3 {
		t.Fatalf("calls %v, want the 3 jobs sent", calls)
	}
}

func TestARefusedBatchIsSentAgainOneJobPerCall(t *testing.T) {
	s := &stubSender{refuse: func(jobs []*pb.EnqueueRequest) error {
		for i, j := range jobs {
			if string(j.GetPayload()) == "bad" {
				if len(jobs) > 1 {
					return status.Errorf(codes.InvalidArgument, "jobs[%d].headers must not have an empty name", i)
				}
				return status.Error(codes.InvalidArgument, "headers must not have an empty name")
			}
		}
		return nil
	}}
	co := testCoalescer(batchConfig{maxJobs: 100, linger: time.Hour, maxInFlight: 4}, s)
	jobs := addInOrder(co, []string{"a", "bad", "c"})
	co.close()
	calls, _ := s.recorded()
	if len(calls) != 4 || len(calls[0]) != 3 {
		t.Fatalf("calls %v, want the batch then each job alone", calls)
	}
	for i, want := range []string{"a", "", "c"} {
		j := jobs[i]
		if got := j.b.results[j.index].JobID; got != want {
			t.Fatalf("job %d answered %q, want %q", i, got, want)
		}
	}
	if err := jobs[1].b.errs[1]; status.Code(err) != codes.InvalidArgument || strings.Contains(err.Error(), "jobs[") {
		t.Fatalf("the bad job's error %v, want a unary call's InvalidArgument", err)
	}
	if jobs[0].b.errs[0] != nil || jobs[2].b.errs[2] != nil {
		t.Fatalf("good jobs failed: %v", jobs[0].b.errs)
	}
}

func TestAnErrorThatMayFollowTheWriteIsEveryCallersOwn(t *testing.T) {
	unavailable := status.Error(codes.Unavailable, "broker down")
	s := &stubSender{refuse: func([]*pb.EnqueueRequest) error { return unavailable }}
	co := testCoalescer(batchConfig{maxJobs: 100, linger: time.Hour, maxInFlight: 4}, s)
	jobs := addInOrder(co, payloads(0, 3))
	co.close()
	if calls, _ := s.recorded(); len(calls) != 1 {
		t.Fatalf("calls %v, want the one batch and no job sent again", calls)
	}
	for i, j := range jobs {
		if j.b.errs[j.index] != unavailable {
			t.Fatalf("job %d: %v, want the batch's error", i, j.b.errs[j.index])
		}
	}
}

func TestTheBatchDeadlineIsItsCallersEarliest(t *testing.T) {
	s := &stubSender{}
	co := testCoalescer(batchConfig{maxJobs: 100, linger: time.Hour, maxInFlight: 4}, s)
	now := time.Now()
	var jobs []pendingJob
	for i, d := range []time.Duration{time.Minute, 20 * time.Second, 0, time.Hour} {
		job := NewEnqueueRequest("q", []byte(strconv.Itoa(i)))
		ctx := context.Background()
		var deadline time.Time
		if d > 0 {
			deadline = now.Add(d)
		}
		b, index, _, _ := co.add(ctx, co.keyOf(ctx, job), job, deadline)
		jobs = append(jobs, pendingJob{b, index})
	}
	co.close()
	if len(s.deadlines) != 1 || !s.deadlines[0].Equal(now.Add(20*time.Second)) {
		t.Fatalf("call deadlines %v, want %v", s.deadlines, now.Add(20*time.Second))
	}
}

func TestJobsOfDifferentKeysGoInDifferentBatches(t *testing.T) {
	s := &stubSender{}
	co := testCoalescer(batchConfig{maxJobs: 100, linger: time.Hour, maxInFlight: 4}, s)
	partitions := uint32(0)
	co.partitions = func() uint32 { return partitions }
	ctx := context.Background()
	add := func(queue, payload string, opts ...EnqueueOption) {
		job := NewEnqueueRequest(queue, []byte(payload), opts...)
		co.add(ctx, co.keyOf(ctx, job), job, time.Time{})
	}
	// No layout known: by queue. Dedup-keyed jobs apart from the others.
	add("a", "a1")
	add("b", "b1")
	add("a", "a2", WithDedupKey("k"))
	add("a", "a3")
	// A layout of 4 partitions: queues of one partition together.
	partitions = 4
	var sameP, otherP []string
	for i := 0; len(sameP) < 2 || len(otherP) < 1; i++ {
		q := "q" + strconv.Itoa(i)
		switch p := partitionOfQueue(q, 4); {
		case p == 0 && len(sameP) < 2:
			sameP = append(sameP, q)
		case p != 0 && len(otherP) < 1:
			otherP = append(otherP, q)
		}
	}
	add(sameP[0], "p0-1")
	add(sameP[1], "p0-2")
	add(otherP[0], "other")
	co.close()
	calls, _ := s.recorded()
	var got []string
	for _, c := range calls {
		got = append(got, strings.Join(c, ","))
	}
	slices.Sort(got)
	want := []string{"a1,a3", "a2", "b1", "other", "p0-1,p0-2"}
	if !slices.Equal(got, want) {
		t.Fatalf("batches %v, want %v", got, want)
	}
}

func TestACallerThatGivesUpLeavesItsJobInTheBatch(t *testing.T) {
	s := &stubSender{hold: make(chan struct{})}
	co := testCoalescer(batchConfig{maxJobs: 100, maxInFlight: 1}, s)
	first := make(chan error, 1)
	go func() {
		_, err := co.enqueue(context.Background(), NewEnqueueRequest("q", []byte("first")))
		first <- err
	}()
	waitUntil(t, "the first call", func() bool { calls, _ := s.recorded(); return len(calls) == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() {
		_, err := co.enqueue(ctx, NewEnqueueRequest("q", []byte("given up")))
		gaveUp <- err
	}()
	waitUntil(t, "the second job to wait", func() bool {
		co.mu.Lock()
		defer co.mu.Unlock()
		for _, ks := range co.keys {
			return ks.open != nil && len(ks.open.jobs) == 1
		}
		return false
	})
	cancel()
	if err := <-gaveUp; status.Code(err) != codes.Canceled {
		t.Fatalf("the caller that gave up got %v, want Canceled", err)
	}
	close(s.hold)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	co.close()
	if calls, _ := s.recorded(); !slices.EqualFunc(calls, [][]string{{"first"}, {"given up"}}, slices.Equal) {
		t.Fatalf("calls %v, want the given-up job sent too", calls)
	}
}
