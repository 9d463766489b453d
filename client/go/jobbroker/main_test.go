package jobbroker_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"jobbroker.dev/client/go/jobbroker"
	pb "jobbroker.dev/client/go/jobbrokerv1"
)

// The broker every test shares (each test uses queues of its own), started by TestMain.
var shared *testBroker

// Fast retries so that retry tests do not wait for the default 1 s backoff.
const sharedConfig = `{"defaultPolicy": {"retry": {"maxAttempts": 3, "initialBackoff": "0.05s", "jitter": "JITTER_NONE"}}}`

func TestMain(m *testing.M) {
	if mode := os.Getenv(childModeEnv); mode != "" {
		os.Exit(runChild(mode))
	}
	var err error
	shared, err = startBroker(sharedConfig, "127.0.0.1:0", "")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot start the broker:", err)
		os.Exit(1)
	}
	code := m.Run()
	shared.stop()
	if code != 0 {
		shared.dumpLog(os.Stderr)
	}
	os.Exit(code)
}

// repoRoot is found from this file's location, not from the working directory.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

func brokerBinary() string {
	if b := os.Getenv("JOBBROKER_BIN"); b != "" {
		return b
	}
	return filepath.Join(repoRoot(), "build", "server", "jobbroker")
}

type testBroker struct {
	cmd     *exec.Cmd
	addr    string
	http    string // the /metrics listener
	dataDir string
	config  string
	logPath string
	ownDir  bool
	exited  chan struct{}
}

var servingLine = regexp.MustCompile(`^jobbroker: serving grpc=(\S+) http=(\S+)`)

// startBroker starts the real broker binary. listen is usually 127.0.0.1:0; dataDir "" makes
// a fresh one (removed by stop); extra are more flags (TLS, tokens).
// restartableBroker starts a broker for a test that restarts it. restart(whileDown) stops the
// broker (SIGTERM; or does nothing to one the test already killed, kill9), runs whileDown (if
// not nil) while it is away, and starts a new one on the same address and data directory; the
// test's end stops the latest and removes the directory.
func restartableBroker(t *testing.T) (*testBroker, func(whileDown func()) *testBroker) {
	t.Helper()
	current, err := startBroker(sharedConfig, "127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	dataDir := current.dataDir
	current.ownDir = false // the restarted broker keeps the data directory
	t.Cleanup(func() { current.stop() })
	restart := func(whileDown func()) *testBroker {
		addr := current.addr
		current.stop()
		if whileDown != nil {
			whileDown()
		}
		next, err := startBroker(sharedConfig, addr, dataDir)
		if err != nil {
			t.Fatal(err)
		}
		next.ownDir = true
		current = next
		return next
	}
	return current, restart
}

func startBroker(config, listen, dataDir string, extra ...string) (*testBroker, error) {
	b := &testBroker{dataDir: dataDir, exited: make(chan struct{})}
	if dataDir == "" {
		d, err := os.MkdirTemp("", "jobbroker-go-test-")
		if err != nil {
			return nil, err
		}
		b.dataDir, b.ownDir = d, true
	}
	args := []string{"--listen", listen, "--http-listen", "127.0.0.1:0",
		"--data-dir", filepath.Join(b.dataDir, "data"), "--log-level", "warn"}
	if config != "" {
		b.config = filepath.Join(b.dataDir, "config.json")
		if err := os.WriteFile(b.config, []byte(config), 0o644); err != nil {
			return nil, err
		}
		args = append(args, "--config", b.config)
	}
	args = append(args, extra...)
	logFile, err := os.CreateTemp(b.dataDir, "broker-*.log")
	if err != nil {
		return nil, err
	}
	b.logPath = logFile.Name()
	b.cmd = exec.Command(brokerBinary(), args...)
	b.cmd.Stderr = logFile
	stdout, err := b.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := b.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { b.cmd.Wait(); logFile.Close(); close(b.exited) }()
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	// The reader drops lines once the buffer is full, so the broker's stdout never fills.
	deadline := time.After(30 * time.Second)
	for {
		select {
		case l := <-lines:
			if m := servingLine.FindStringSubmatch(l); m != nil {
				b.addr, b.http = m[1], m[2]
				return b, nil
			}
		case <-b.exited:
			return nil, fmt.Errorf("broker exited before serving (log in %s)", b.logPath)
		case <-deadline:
			b.cmd.Process.Kill()
			return nil, fmt.Errorf("broker did not print its serving line in time")
		}
	}
}

// stop sends SIGTERM and waits (SIGKILL after 20 s).
func (b *testBroker) stop() {
	b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
	case <-time.After(20 * time.Second):
		b.cmd.Process.Kill()
		<-b.exited
	}
	if b.ownDir {
		os.RemoveAll(b.dataDir)
	}
}

// kill9 ends the broker at once (SIGKILL, which also ends a broker stopped by SIGSTOP): a
// crash. A restart (restartableBroker) then starts a new one on its address and data directory.
func (b *testBroker) kill9() {
	b.cmd.Process.Kill()
	<-b.exited
}

func (b *testBroker) dumpLog(w io.Writer) {
	if data, err := os.ReadFile(b.logPath); err == nil && len(data) > 0 {
		fmt.Fprintf(w, "--- broker log ---\n%s\n", data)
	}
}

func newClient(t *testing.T, b *testBroker) *jobbroker.Client {
	t.Helper()
	c, err := jobbroker.NewClient(b.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

var queueSeq atomic.Int64

// queueFor names a queue of the test's own.
func queueFor(t *testing.T) string {
	name := regexp.MustCompile(`[^A-Za-z0-9._:-]`).ReplaceAllString(t.Name(), ".")
	return fmt.Sprintf("%s.%d.%d", name, os.Getpid(), queueSeq.Add(1))
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond until it holds; the timeout is only a bound for giving up.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitState(t *testing.T, c *jobbroker.Client, jobID string, state pb.JobState) *pb.Job {
	t.Helper()
	var job *pb.Job
	waitFor(t, fmt.Sprintf("job %s to be %v", jobID, state), func() bool {
		j, err := c.GetJob(context.Background(), jobID)
		if err != nil {
			t.Fatalf("GetJob: %v", err)
		}
		job = j
		return j.GetState() == state
	})
	return job
}

// runWorker runs w until the test ends (or stop is called) and returns stop, which cancels
// Run's context and returns what Run returned.
func runWorker(t *testing.T, w *jobbroker.Worker) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var result error
	stopped := false
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case result = <-done:
			case <-time.After(60 * time.Second):
				t.Errorf("worker did not stop")
			}
		}
		return result
	}
	t.Cleanup(func() { stop() })
	return stop
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

func countLines(lines []string, prefix string) int {
	n := 0
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		return err
	}
	return f.Sync()
}
