package jobbroker_test

// Tests of the client options against the real broker: TLS, mutual TLS and bearer tokens, the
// safe-retry rule, several addresses, and the default deadline.

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"jobbroker.dev/client/go/jobbroker"
	pb "jobbroker.dev/client/go/jobbrokerv1"
)

// testPKI is a throwaway CA with a server certificate for 127.0.0.1 and a client certificate.
type testPKI struct{ dir, ca, serverCert, serverKey, clientCert, clientKey string }

// makePKI makes the certificates with the openssl command, as an operator would.
func makePKI(t *testing.T) testPKI {
	t.Helper()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("openssl is not installed")
	}
	dir := t.TempDir()
	p := testPKI{
		dir: dir, ca: filepath.Join(dir, "ca.pem"),
		serverCert: filepath.Join(dir, "server.pem"), serverKey: filepath.Join(dir, "server.key"),
		clientCert: filepath.Join(dir, "client.pem"), clientKey: filepath.Join(dir, "client.key"),
	}
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command("openssl", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("openssl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ec := []string{"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"}
	run(append([]string{"req", "-x509", "-days", "1", "-subj", "/CN=jobbroker test CA", "-keyout", "ca.key", "-out", "ca.pem"}, ec...)...)
	sign := func(name, subject, ext string) {
		if err := os.WriteFile(filepath.Join(dir, name+".ext"), []byte(ext+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		run(append([]string{"req", "-subj", subject, "-keyout", name + ".key", "-out", name + ".csr"}, ec...)...)
		run("x509", "-req", "-days", "1", "-in", name+".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
			"-CAcreateserial", "-out", name+".pem", "-extfile", name+".ext")
	}
	sign("server", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth")
	sign("client", "/CN=go-test-client", "extendedKeyUsage=clientAuth")
	return p
}

// A token with every client role; the broker's file holds it in plaintext (development form).
const testToken = "go-test-token-0123456789"

// startSecureBroker starts a broker that asks for mutual TLS and tokens.
func startSecureBroker(t *testing.T, pki testPKI) *testBroker {
	t.Helper()
	tokens := filepath.Join(pki.dir, "tokens.json")
	err := os.WriteFile(tokens, []byte(`{"tokens": [{"name": "go-test", "token": "`+testToken+
		`", "roles": ["producer", "worker", "admin"], "queues": ["*"]}]}`), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	b, err := startBroker(sharedConfig, "127.0.0.1:0", "",
		"--tls-cert", pki.serverCert, "--tls-key", pki.serverKey, "--tls-client-ca", pki.ca,
		"--auth-tokens", tokens)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			b.dumpLog(os.Stderr)
		}
		b.stop()
	})
	return b
}

func newClientWith(t *testing.T, opts jobbroker.Options) *jobbroker.Client {
	t.Helper()
	c, err := jobbroker.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestMutualTLSAndTokenRunAJobAndTheWorkerIsListed(t *testing.T) {
	pki := makePKI(t)
	b := startSecureBroker(t, pki)
	ctx, q := testCtx(t), queueFor(t)
	c := newClientWith(t, jobbroker.Options{
		Address: b.addr, CAFile: pki.ca, CertFile: pki.clientCert, KeyFile: pki.clientKey, Token: testToken,
	})

	w := jobbroker.NewWorker(c, jobbroker.WorkerOptions{WorkerID: "tls-worker"})
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error {
		job.SetResult([]byte("done over tls"))
		return nil
	})
	runWorker(t, w)
	job, err := c.EnqueueAndWait(ctx, q, []byte("x"))
	if err != nil {
		t.Fatalf("EnqueueAndWait: %v", err)
	}
	if string(job.GetResult()) != "done over tls" {
		t.Fatalf("result = %q", job.GetResult())
	}
	workers, err := c.ListWorkers(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if len(workers) != 1 || workers[0].GetWorkerId() != "tls-worker" || workers[0].GetClient() != jobbroker.ClientName {
		t.Fatalf("ListWorkers = %v", workers)
	}
}

func TestTheTokenComesFromTheEnvironmentWhenUnset(t *testing.T) {
	pki := makePKI(t)
	b := startSecureBroker(t, pki)
	t.Setenv("JOBBROKER_TOKEN", testToken)
	t.Setenv("JOBBROKER_ADDRESS", b.addr)
	c := newClientWith(t, jobbroker.Options{CAFile: pki.ca, CertFile: pki.clientCert, KeyFile: pki.clientKey})
	if _, err := c.Enqueue(testCtx(t), queueFor(t), []byte("x")); err != nil {
		t.Fatalf("Enqueue with $JOBBROKER_TOKEN and $JOBBROKER_ADDRESS: %v", err)
	}
}

func TestAMissingOrWrongTokenIsRefusedAndEndsTheWorker(t *testing.T) {
	pki := makePKI(t)
	b := startSecureBroker(t, pki)
	t.Setenv("JOBBROKER_TOKEN", "") // the test must not pick up a token from the environment
	ctx, q := testCtx(t), queueFor(t)
	tlsOnly := jobbroker.Options{Address: b.addr, CAFile: pki.ca, CertFile: pki.clientCert, KeyFile: pki.clientKey}

	noToken := newClientWith(t, tlsOnly)
	if _, err := noToken.Enqueue(ctx, q, []byte("x")); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("Enqueue without a token: %v, want Unauthenticated", err)
	}

	wrong := tlsOnly
	wrong.Token = "not-the-token"
	w := jobbroker.NewWorker(newClientWith(t, wrong), jobbroker.WorkerOptions{})
	ran := atomic.Bool{}
	w.HandleFunc(q, func(ctx context.Context, job *jobbroker.Job) error { ran.Store(true); return nil })
	runCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := w.Run(runCtx); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("Run with a wrong token = %v, want Unauthenticated (not a reconnect loop)", err)
	}
	if ran.Load() {
		t.Fatal("a handler ran with a refused token")
	}
}

func TestWithoutTheClientCertificateMutualTLSRefusesTheConnection(t *testing.T) {
	pki := makePKI(t)
	b := startSecureBroker(t, pki)
	c := newClientWith(t, jobbroker.Options{Address: b.addr, CAFile: pki.ca, Token: testToken})
	if _, err := c.GetCluster(testCtx(t)); status.Code(err) != codes.Unavailable {
		t.Fatalf("GetCluster without a client certificate: %v, want Unavailable", err)
	}
}

func TestBadTLSFilesAreAnErrorOfNew(t *testing.T) {
	_, err := jobbroker.New(jobbroker.Options{Address: "127.0.0.1:1", CAFile: "/nonexistent/ca.pem"})
	if err == nil || !strings.Contains(err.Error(), "CA file") {
		t.Fatalf("New with a missing CA file: %v", err)
	}
}

// deadAddress is a local port nothing listens on: a stopped broker.
func deadAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// attemptCounter counts the unary calls that reach the connection, retries included; not the
// GetCluster the client sends before each of them to learn where to send it.
type attemptCounter struct{ n atomic.Int64 }

func (a *attemptCounter) interceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if method != pb.Admin_GetCluster_FullMethodName {
		a.n.Add(1)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// attempts runs call against a stopped broker and returns how many times it was sent.
func attempts(t *testing.T, call func(ctx context.Context, c *jobbroker.Client) error) int64 {
	t.Helper()
	var counter attemptCounter
	c := newClientWith(t, jobbroker.Options{
		Address:     deadAddress(t),
		DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(counter.interceptor)},
	})
	if err := call(testCtx(t), c); status.Code(err) != codes.Unavailable {
		t.Fatalf("call against a stopped broker: %v, want Unavailable", err)
	}
	return counter.n.Load()
}

func TestAnEnqueueWithoutADedupKeyIsAttemptedOnce(t *testing.T) {
	n := attempts(t, func(ctx context.Context, c *jobbroker.Client) error {
		_, err := c.Enqueue(ctx, "q", []byte("x"))
		return err
	})
	if n != 1 {
		t.Fatalf("an Enqueue without a dedup key was sent %d times, want 1: a repeat could enqueue it twice", n)
	}
}

func TestABatchWithOneJobWithoutADedupKeyIsAttemptedOnce(t *testing.T) {
	n := attempts(t, func(ctx context.Context, c *jobbroker.Client) error {
		_, err := c.EnqueueBatch(ctx, []*pb.EnqueueRequest{
			jobbroker.NewEnqueueRequest("q", []byte("a"), jobbroker.WithDedupKey("a")),
			jobbroker.NewEnqueueRequest("q", []byte("b")),
		})
		return err
	})
	if n != 1 {
		t.Fatalf("sent %d times, want 1", n)
	}
}

func TestCallsThatCannotDuplicateAreRetriedThreeTimes(t *testing.T) {
	calls := map[string]func(ctx context.Context, c *jobbroker.Client) error{
		"Enqueue with a dedup key": func(ctx context.Context, c *jobbroker.Client) error {
			_, err := c.Enqueue(ctx, "q", []byte("x"), jobbroker.WithDedupKey("k"))
			return err
		},
		"EnqueueBatch, every job with a dedup key": func(ctx context.Context, c *jobbroker.Client) error {
			_, err := c.EnqueueBatch(ctx, []*pb.EnqueueRequest{
				jobbroker.NewEnqueueRequest("q", []byte("a"), jobbroker.WithDedupKey("a")),
				jobbroker.NewEnqueueRequest("q", []byte("b"), jobbroker.WithDedupKey("b")),
			})
			return err
		},
		"GetJob": func(ctx context.Context, c *jobbroker.Client) error {
			_, err := c.GetJob(ctx, "01J00000000000000000000000")
			return err
		},
		"Ack": func(ctx context.Context, c *jobbroker.Client) error {
			return c.Ack(ctx, "01J00000000000000000000000", "lease", nil)
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			if n := attempts(t, call); n != 3 {
				t.Fatalf("sent %d times, want 3", n)
			}
		})
	}
}

func TestCallsThatWouldActTwiceAreNotRetried(t *testing.T) {
	n := attempts(t, func(ctx context.Context, c *jobbroker.Client) error {
		_, err := c.TriggerSchedule(ctx, "nightly")
		return err
	})
	if n != 1 {
		t.Fatalf("TriggerSchedule was sent %d times, want 1", n)
	}
}

func TestAddressesAreTriedInOrder(t *testing.T) {
	c := newClientWith(t, jobbroker.Options{Addresses: []string{deadAddress(t), shared.addr}})
	ctx, q := testCtx(t), queueFor(t)
	enq, err := c.Enqueue(ctx, q, []byte("x"))
	if err != nil {
		t.Fatalf("Enqueue with the first address down: %v", err)
	}
	if _, err := c.GetJob(ctx, enq.JobID); err != nil {
		t.Fatal(err)
	}
}

// silentAddress is a local port that accepts connections and never answers: a broker that
// hangs. Calls to it end only by their deadline.
func silentAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, conn) // kept open, never written to
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	return l.Addr().String()
}

func TestTheDefaultDeadlineBoundsUnaryCalls(t *testing.T) {
	c := newClientWith(t, jobbroker.Options{Address: silentAddress(t), DefaultDeadline: 200 * time.Millisecond})
	if _, err := c.GetCluster(context.Background()); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("GetCluster of a broker that never answers: %v, want DeadlineExceeded", err)
	}
}

func TestALongPollAndTheCallersDeadlineOutlastTheDefaultDeadline(t *testing.T) {
	c := newClientWith(t, jobbroker.Options{Address: shared.addr, DefaultDeadline: 200 * time.Millisecond})
	q := queueFor(t)
	// The default deadline counts from the end of the long poll: an empty queue answers no job.
	jobs, err := c.Lease(context.Background(), q, jobbroker.LeaseOptions{Wait: time.Second})
	if err != nil || len(jobs) != 0 {
		t.Fatalf("Lease with a long poll = %v, %v; want no job and no error", jobs, err)
	}
	// The caller's own deadline wins over the default one: with the caller's deadline set, the
	// call is not extended by the wait, so only that deadline lets a 1 s poll end normally.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	jobs, err = c.Lease(ctx, q, jobbroker.LeaseOptions{Wait: time.Second})
	if err != nil || len(jobs) != 0 {
		t.Fatalf("Lease with the caller's deadline = %v, %v; want no job and no error", jobs, err)
	}
}
