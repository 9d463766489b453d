package jobbroker_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"jobbroker.dev/client/go/jobbroker"
	pb "jobbroker.dev/client/go/jobbrokerv1"
)

// testCluster is etcd and three broker nodes on loopback, started as tests/lib/cluster.sh starts
// a cluster deployment, for the tests of routing. Each test that needs one starts its own and
// the test's end stops it: the nodes by their PID, then etcd.
type testCluster struct {
	addresses []string // node-0, node-1, node-2
	http      []string // each node's --http-listen, where its /metrics is
	nodes     []*exec.Cmd
	dir       string
}

const clusterPartitions = 4

func startCluster(t *testing.T) *testCluster {
	t.Helper()
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Skip("no etcd on PATH (Debian's etcd-server): the cluster tests need one")
	}
	cl := &testCluster{dir: t.TempDir()}
	// All of the cluster's ports at once, so that no two are the same.
	ports := freeAddresses(t, 8)
	etcdURL := "http://" + ports[0]
	etcd := exec.Command("etcd", "--data-dir", filepath.Join(cl.dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", "http://"+ports[1])
	cl.start(t, etcd, "etcd.log")
	t.Cleanup(func() { stopProcess(etcd) })
	t.Cleanup(cl.stopNodes) // runs before etcd's: a node leaves etcd as it stops
	config := filepath.Join(cl.dir, "config.json")
	// A job failed by a node's death runs again 0.1 s later.
	retry := `{"defaultPolicy": {"retry": {"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "0.1s"}}}`
	if err := os.WriteFile(config, []byte(retry), 0o644); err != nil {
		t.Fatal(err)
	}
	for n := range 3 {
		cl.addresses = append(cl.addresses, ports[2+n])
		cl.http = append(cl.http, ports[5+n])
		node := exec.Command(brokerBinary(), "--listen", cl.addresses[n], "--http-listen", cl.http[n],
			"--data-dir", filepath.Join(cl.dir, fmt.Sprintf("node-%d", n)),
			"--partitions", fmt.Sprint(clusterPartitions), "--cluster-etcd", etcdURL,
			"--node-id", fmt.Sprintf("node-%d", n), "--cluster-initial-nodes", "3",
			"--config", config, "--log-level", "warn")
		cl.start(t, node, fmt.Sprintf("node-%d.log", n))
		cl.nodes = append(cl.nodes, node)
	}
	c := cl.client(t)
	// A leader elected away from its partition's preferred replica (replicas[0]) hands the
	// partition back a few seconds later: wait for that, so that leaders stay where the test
	// saw them.
	waitForCluster(t, c, "every partition led by its preferred node with 3 nodes in sync", func(info *pb.ClusterInfo) bool {
		if len(info.GetPartitions()) != clusterPartitions {
			return false
		}
		for _, p := range info.GetPartitions() {
			if len(p.GetReplicas()) == 0 || p.GetLeaderNodeId() != p.GetReplicas()[0] || len(p.GetInSync()) != 3 {
				return false
			}
		}
		return true
	})
	// A leader answers Unavailable until it serves its partition (it is still starting).
	for partition := range uint32(clusterPartitions) {
		queue := queueInPartition(t, partition)
		waitFor(t, fmt.Sprintf("partition %d to serve", partition), func() bool {
			_, err := c.GetQueue(context.Background(), queue)
			return status.Code(err) != codes.Unavailable
		})
	}
	return cl
}

func (cl *testCluster) start(t *testing.T, cmd *exec.Cmd, logName string) {
	t.Helper()
	logFile, err := os.Create(filepath.Join(cl.dir, logName))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		logFile.Close()
		if t.Failed() {
			if data, err := os.ReadFile(logFile.Name()); err == nil {
				t.Logf("--- %s ---\n%s", logName, tail(string(data), 30))
			}
		}
	})
}

func tail(text string, lines int) string {
	all := strings.Split(strings.TrimRight(text, "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}

// kill9 kills node n as a machine dies: no hand-over of its partitions.
func (cl *testCluster) kill9(n int) {
	cl.nodes[n].Process.Kill()
	cl.nodes[n].Wait()
}

func (cl *testCluster) stopNodes() {
	var wg sync.WaitGroup
	for _, node := range cl.nodes {
		wg.Add(1)
		go func() { defer wg.Done(); stopProcess(node) }()
	}
	wg.Wait()
}

// stopProcess sends SIGTERM, then SIGKILL after 30 s; a process already reaped is left alone.
func stopProcess(cmd *exec.Cmd) {
	if cmd.ProcessState != nil {
		return
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}

// freeAddresses gives count distinct loopback addresses whose ports are free right now, below
// the kernel's ephemeral range (as the C++ harnesses pick theirs, tests/testing/process_util.h).
// A port that listening on port 0 handed out is released at once, so it can be handed out again
// (two processes of one cluster were once given the same port, and a node exited "cannot
// listen") or become an outgoing connection's local port before the process given it binds.
func freeAddresses(t *testing.T, count int) []string {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if fields := strings.Fields(string(b)); len(fields) > 0 {
			if n, err := strconv.Atoi(fields[0]); err == nil {
				low = n
			}
		}
	}
	hi := min(low, 32768) - 1
	lo := max(1024, hi-12000)
	var picked []string
	for i := 0; i < 100*count && len(picked) < count; i++ {
		address := fmt.Sprintf("127.0.0.1:%d", lo+rand.IntN(hi-lo+1))
		if slices.Contains(picked, address) {
			continue
		}
		l, err := net.Listen("tcp", address)
		if err != nil {
			continue // in use
		}
		l.Close()
		picked = append(picked, address)
	}
	if len(picked) < count {
		t.Fatalf("no %d free ports in %d..%d", count, lo, hi)
	}
	return picked
}

// client is a client of the cluster as an application makes one: given every node's address.
func (cl *testCluster) client(t *testing.T, dial ...grpc.DialOption) *jobbroker.Client {
	t.Helper()
	c, err := jobbroker.New(jobbroker.Options{Addresses: cl.addresses, DialOptions: dial})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitForCluster polls GetCluster until cond holds, for up to 60 s.
func waitForCluster(t *testing.T, c *jobbroker.Client, what string, cond func(*pb.ClusterInfo) bool) *pb.ClusterInfo {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		info, err := c.GetCluster(ctx)
		cancel()
		if err == nil && cond(info) {
			return info
		}
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s; last GetCluster: %v, %v", what, info, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// leaderOf is the address of the partition's leader in info ("" if none).
func leaderOf(info *pb.ClusterInfo, partition uint32) string {
	for _, p := range info.GetPartitions() {
		if p.GetPartition() == partition {
			return p.GetLeaderAddress()
		}
	}
	return ""
}

// sentCall is one call as it left the client: the method, the address of the connection it
// went on (a node's, or the connection over every given address), and whether it succeeded.
type sentCall struct {
	method, target string
	ok             bool
}

// callRecorder is a client interceptor that records where each call goes.
type callRecorder struct {
	mu    sync.Mutex
	calls []sentCall
}

func (r *callRecorder) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			err := invoker(ctx, method, req, reply, cc, opts...)
			r.add(sentCall{method, cc.Target(), err == nil})
			return err
		}),
		grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			stream, err := streamer(ctx, desc, cc, method, opts...)
			r.add(sentCall{method, cc.Target(), err == nil})
			return stream, err
		}),
	}
}

func (r *callRecorder) add(call sentCall) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, call)
}

// last is the latest call of method, successful only if ok is set.
func (r *callRecorder) last(method string, onlyOK bool) (sentCall, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.calls) - 1; i >= 0; i-- {
		if c := r.calls[i]; c.method == method && (c.ok || !onlyOK) {
			return c, true
		}
	}
	return sentCall{}, false
}

// queueInPartition names a queue of the test's own that lives in partition.
func queueInPartition(t *testing.T, partition uint32) string {
	for {
		if q := queueFor(t); jobbroker.PartitionOfQueue(q, clusterPartitions) == partition {
			return q
		}
	}
}

func TestInAClusterEachCallGoesToItsPartitionsLeaderAndFollowsItWhenItDies(t *testing.T) {
	cl := startCluster(t)
	var recorder callRecorder
	c := cl.client(t, recorder.dialOptions()...)
	ctx := testCtx(t)
	info, err := c.GetCluster(ctx)
	if err != nil {
		t.Fatal(err)
	}

	queues := map[uint32]string{}
	for partition := range uint32(clusterPartitions) {
		q := queueInPartition(t, partition)
		queues[partition] = q
		leader := leaderOf(info, partition)
		enq, err := c.Enqueue(ctx, q, []byte("routed"))
		if err != nil {
			t.Fatalf("Enqueue to %s: %v", q, err)
		}
		if p, _ := jobbroker.PartitionOfJobID(enq.JobID, clusterPartitions); p != partition {
			t.Errorf("job %s of queue %s names partition %d, want %d", enq.JobID, q, p, partition)
		}
		if _, err := c.GetJob(ctx, enq.JobID); err != nil {
			t.Fatalf("GetJob: %v", err)
		}
		if _, err := c.GetQueue(ctx, q); err != nil {
			t.Fatalf("GetQueue: %v", err)
		}
		for _, method := range []string{pb.Broker_Enqueue_FullMethodName, pb.Admin_GetJob_FullMethodName, pb.Admin_GetQueue_FullMethodName} {
			if call, _ := recorder.last(method, true); call.target != leader {
				t.Errorf("partition %d: %s went to %q, want its leader %s", partition, method, call.target, leader)
			}
		}
	}

	// Jobs of partition 0's queue done by a worker, then the death of that partition's leader.
	q := queues[0]
	var acked []string
	for i := range 3 {
		enq, err := c.Enqueue(ctx, q, []byte("before"), jobbroker.WithDedupKey(fmt.Sprint("before-", i)))
		if err != nil {
			t.Fatal(err)
		}
		acked = append(acked, enq.JobID)
	}
	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{Concurrency: 2})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error { return nil })
	runWorker(t, w)
	for _, id := range acked {
		waitState(t, c, id, pb.JobState_JOB_STATE_COMPLETED)
	}
	if call, _ := recorder.last(pb.Broker_Work_FullMethodName, true); call.target != leaderOf(info, 0) {
		t.Errorf("the worker's stream went to %q, want its queue's leader %s", call.target, leaderOf(info, 0))
	}

	dead := leaderOf(info, 0)
	cl.kill9(indexOf(t, cl.addresses, dead))
	deadline := time.Now().Add(60 * time.Second)
	var after jobbroker.Enqueued
	for {
		attemptCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		after, err = c.Enqueue(attemptCtx, q, []byte("after"), jobbroker.WithDedupKey("after-the-kill"))
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Enqueue with a dedup key after the leader's death: still %v after 60 s", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	moved := waitForCluster(t, c, "partition 0 to have a live leader", func(info *pb.ClusterInfo) bool {
		leader := leaderOf(info, 0)
		return leader != "" && leader != dead
	})
	if call, _ := recorder.last(pb.Broker_Enqueue_FullMethodName, true); call.target != leaderOf(moved, 0) {
		t.Errorf("the Enqueue after the kill went to %q, want the new leader %s", call.target, leaderOf(moved, 0))
	}
	for _, id := range acked {
		if job, err := c.GetJob(ctx, id); err != nil || job.GetState() != pb.JobState_JOB_STATE_COMPLETED {
			t.Errorf("acked job %s after the leader's death: %v, %v; want COMPLETED", id, job.GetState(), err)
		}
	}
	waitState(t, c, after.JobID, pb.JobState_JOB_STATE_COMPLETED)
	// Meanwhile the worker's stream may have gone through a node relaying it (while the
	// partition had no leader); that node ends it once the partition has one.
	waitFor(t, "the worker's stream to go to the new leader "+leaderOf(moved, 0), func() bool {
		call, _ := recorder.last(pb.Broker_Work_FullMethodName, true)
		return call.target == leaderOf(moved, 0)
	})
}

func indexOf(t *testing.T, addresses []string, address string) int {
	t.Helper()
	for i, a := range addresses {
		if a == address {
			return i
		}
	}
	t.Fatalf("%q is none of the nodes %v", address, addresses)
	return -1
}

// metric is the value of an unlabelled gauge or counter on node n's /metrics; -1 if the node
// does not answer or does not show it.
func (cl *testCluster) metric(t *testing.T, n int, name string) float64 {
	t.Helper()
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + cl.http[n] + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		if value, ok := strings.CutPrefix(lines.Text(), name+" "); ok {
			if v, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil {
				return v
			}
		}
	}
	return -1
}

// enqueueUntilAccepted enqueues with a dedup key, again while the queue's partition has no
// leader (a leader just died), for up to 60 s.
func enqueueUntilAccepted(t *testing.T, c *jobbroker.Client, queue, dedupKey string) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		enq, err := c.Enqueue(ctx, queue, []byte(dedupKey), jobbroker.WithDedupKey(dedupKey))
		cancel()
		if err == nil {
			return enq.JobID
		}
		if time.Now().After(deadline) {
			t.Fatalf("Enqueue to %s: still %v after 60 s", queue, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitCompleted waits for each job to be completed, asking again when its partition has no
// leader for a moment (a leader just died), for up to 60 s in all.
func waitCompleted(t *testing.T, c *jobbroker.Client, jobIDs []string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for _, id := range jobIDs {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			job, err := c.GetJob(ctx, id)
			cancel()
			if err == nil && job.GetState() == pb.JobState_JOB_STATE_COMPLETED {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("gave up waiting for job %s to complete: %v, %v", id, job.GetState(), err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// A worker over two queues whose partitions two different nodes lead holds a stream on each
// leader (docs/worker-contract.md §5), even when given the node that leads neither first: no
// node relays its streams. When one leader dies it regroups onto the new leader.
func TestAWorkerHoldsOneStreamPerLeadingNodeAndFollowsALeadersDeath(t *testing.T) {
	cl := startCluster(t)
	c := cl.client(t)
	info := waitForCluster(t, c, "two partitions with different leaders", func(info *pb.ClusterInfo) bool {
		leaders := map[string]bool{}
		for p := range uint32(clusterPartitions) {
			leaders[leaderOf(info, p)] = true
		}
		return len(leaders) >= 2 && !leaders[""]
	})
	pa, pb0 := uint32(0), uint32(0)
	for p := range uint32(clusterPartitions) {
		if leaderOf(info, p) != leaderOf(info, pa) {
			pb0 = p
			break
		}
	}
	la, lb := indexOf(t, cl.addresses, leaderOf(info, pa)), indexOf(t, cl.addresses, leaderOf(info, pb0))
	neither := 3 - la - lb
	qa, qb := queueInPartition(t, pa), queueInPartition(t, pb0)

	wc, err := jobbroker.New(jobbroker.Options{Addresses: []string{
		cl.addresses[neither], cl.addresses[la], cl.addresses[lb]}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wc.Close() })
	w := jobbroker.NewWorker(wc, jobbroker.WorkerOptions{Concurrency: 4})
	for _, q := range []string{qa, qb} {
		w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error { return nil })
	}
	stop := runWorker(t, w)

	enqueueBoth := func(round string) []string {
		var ids []string
		for _, q := range []string{qa, qb} {
			for i := range 10 {
				ids = append(ids, enqueueUntilAccepted(t, c, q, fmt.Sprintf("%s-%s-%d", round, q, i)))
			}
		}
		return ids
	}
	waitCompleted(t, c, enqueueBoth("first"))
	for n := range 3 {
		relaying, open := cl.metric(t, n, "jobbroker_work_streams_relaying"), cl.metric(t, n, "jobbroker_work_streams_open")
		if relaying != 0 {
			t.Errorf("node-%d relays %v streams, want 0: the worker did not open one stream per leader", n, relaying)
		}
		if n == neither && open != 0 {
			t.Errorf("node-%d, which leads neither queue, has %v open streams, want 0", n, open)
		}
		if n != neither && open < 1 {
			t.Errorf("node-%d, a leader of the worker's queues, has %v open streams, want 1 or more", n, open)
		}
	}

	cl.kill9(la)
	waitCompleted(t, c, enqueueBoth("after-the-kill"))
	deadline := time.Now().Add(30 * time.Second)
	for {
		relaying := 0.0
		for n := range 3 {
			if n != la {
				relaying += cl.metric(t, n, "jobbroker_work_streams_relaying")
			}
		}
		if relaying == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the live nodes still relay %v streams 30 s after a leader's death", relaying)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
}
