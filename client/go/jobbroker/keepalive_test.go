package jobbroker_test

// Keepalive pings: a worker notices a broker that froze (SIGSTOP: the kernel still answers TCP,
// so only an unanswered HTTP/2 ping shows it), gives the connection up and comes back by itself
// once the broker runs again.

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"jobbroker.dev/client/go/jobbroker"
	pb "jobbroker.dev/client/go/jobbrokerv1"
)

func TestWorkerGivesUpAFrozenBrokerAndComesBack(t *testing.T) {
	b, err := startBroker(sharedConfig, "127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.cmd.Process.Signal(syscall.SIGCONT) // a frozen broker would not act on the SIGTERM
		b.stop()
	})
	// 10 s is gRPC-Go's shortest keepalive time; with a 1 s timeout the worker gives a frozen
	// broker up about 11 s after its last frame.
	c := newClientWith(t, jobbroker.Options{Address: b.addr, KeepaliveTime: 10 * time.Second, KeepaliveTimeout: time.Second})
	ctx, q := testCtx(t), queueFor(t)
	var logs syncBuffer
	workerID := "keepalive-" + q
	// 2 s leases: should the job after the thaw go to a connection the worker tried while the
	// broker was frozen, and closed just as the broker answered it, it comes back in seconds.
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{
		WorkerID:      workerID,
		LeaseDuration: 2 * time.Second,
		ReconnectMax:  500 * time.Millisecond,
		Logger:        slog.New(slog.NewTextHandler(&logs, nil)),
	})
	var ran sync.Map
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error {
		ran.Store(job.Text(), true)
		return nil
	})
	runWorker(t, w)
	if _, err := c.Enqueue(ctx, q, []byte("before")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first job to run", func() bool { _, ok := ran.Load("before"); return ok })

	// The worker's end of its connection: the port in ListWorkers' peer ("ipv4:127.0.0.1:PORT").
	workers, err := c.ListWorkers(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if len(workers) != 1 || workers[0].GetWorkerId() != workerID {
		t.Fatalf("ListWorkers = %v, want the one worker %s", workers, workerID)
	}
	workerPort := portOf(t, strings.TrimPrefix(workers[0].GetPeer(), "ipv4:"))
	brokerPort := portOf(t, b.addr)
	if !tcpEstablished(t, workerPort, brokerPort) {
		t.Fatalf("no ESTABLISHED connection from port %d to the broker's %d", workerPort, brokerPort)
	}

	if err := b.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	waitWithin(t, 40*time.Second, "the worker to give the frozen broker's connection up", func() bool {
		return !tcpEstablished(t, workerPort, brokerPort) && w.Stats().Reconnects >= 1
	})
	t.Logf("the worker gave the frozen broker up after %v", time.Since(frozen).Round(time.Millisecond))
	if !hasLine(logs.String(), "stream to the broker ended", "code = Unavailable") {
		t.Fatalf("no stream end with Unavailable in the worker's log:\n%s", logs.String())
	}

	if err := b.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// A fresh producer: c's connection may be in its reconnect backoff and fail fast meanwhile.
	c2 := newClient(t, b)
	enq, err := c2.Enqueue(ctx, q, []byte("after"))
	if err != nil {
		t.Fatal(err)
	}
	job := waitState(t, c2, enq.JobID, pb.JobState_JOB_STATE_COMPLETED)
	attempts := job.GetAttempts()
	if _, ok := ran.Load("after"); !ok || len(attempts) == 0 || attempts[len(attempts)-1].GetWorkerId() != workerID {
		t.Fatalf("job = %v, want completed by worker %s", job, workerID)
	}
}

func TestKeepaliveOptionsOutOfRangeAreRefused(t *testing.T) {
	for _, tc := range []struct {
		opts jobbroker.Options
		name string
	}{
		{jobbroker.Options{KeepaliveTime: -time.Second}, "KeepaliveTime"},
		{jobbroker.Options{KeepaliveTimeout: -time.Second}, "KeepaliveTimeout"},
		{jobbroker.Options{DisableKeepalive: true, KeepaliveTime: -time.Second}, "KeepaliveTime"},
	} {
		newRefuses(t, tc.opts, tc.name)
	}
	// 0 for the defaults, pings off, a time below gRPC's 10 s minimum (raised to it): all work.
	for _, opts := range []jobbroker.Options{
		{},
		{DisableKeepalive: true},
		{KeepaliveTime: time.Second, KeepaliveTimeout: time.Second},
	} {
		opts.Address = shared.addr
		c, err := jobbroker.New(opts)
		if err != nil {
			t.Fatalf("New(%+v): %v", opts, err)
		}
		if _, err := c.ListQueues(testCtx(t)); err != nil {
			t.Fatalf("ListQueues with %+v: %v", opts, err)
		}
		c.Close()
	}
}

// waitWithin polls cond until it holds, giving up after limit.
func waitWithin(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting %v for %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func portOf(t *testing.T, hostPort string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(hostPort)
	if err != nil {
		t.Fatalf("%q: %v", hostPort, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("%q: %v", hostPort, err)
	}
	return port
}

// tcpEstablished reports whether /proc/net/tcp has a connection from local port from to remote
// port to in state ESTABLISHED (01).
func tcpEstablished(t *testing.T, from, to int) bool {
	t.Helper()
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		t.Skipf("no /proc/net/tcp: %v", err)
	}
	defer f.Close()
	port := func(addr string) string { return addr[strings.LastIndex(addr, ":")+1:] }
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "sl local_address rem_address st ...", addresses as HEXIP:HEXPORT.
		fields := strings.Fields(sc.Text())
		if len(fields) >= 4 && port(fields[1]) == fmt.Sprintf("%04X", from) &&
			port(fields[2]) == fmt.Sprintf("%04X", to) && fields[3] == "01" {
			return true
		}
	}
	return false
}

func hasLine(text string, parts ...string) bool {
	for _, l := range strings.Split(text, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			return true
		}
	}
	return false
}

// syncBuffer is a bytes.Buffer that a logger may write from several goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
