package jobbroker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"jobbroker.dev/client/go/jobbroker"
)

// The test binary doubles as the worker process of the tests that kill or signal a worker:
// with $JOBBROKER_TEST_CHILD set, TestMain runs runChild instead of the tests.
const childModeEnv = "JOBBROKER_TEST_CHILD"

// Settings of a child worker, passed in the environment.
const (
	childAddrEnv  = "JOBBROKER_TEST_ADDR"
	childQueueEnv = "JOBBROKER_TEST_QUEUE"
	childLogEnv   = "JOBBROKER_TEST_LOG"  // the file the handler appends what it did to
	childHangEnv  = "JOBBROKER_TEST_HANG" // steps mode: block in step 3 until killed
)

// Step results of the steps worker; they go through JSON in the checkpoint.
type account struct {
	UserID string
	Plan   string
}

func runChild(mode string) int {
	client, err := jobbroker.NewClient(os.Getenv(childAddrEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer client.Close()
	queue, logPath := os.Getenv(childQueueEnv), os.Getenv(childLogEnv)
	hang := os.Getenv(childHangEnv) == "1"

	var w *jobbroker.Worker
	switch mode {
	case "drain":
		// Concurrency 1 with 2 prefetched jobs: one runs, two wait and are given back on SIGTERM.
		w = jobbroker.NewWorker(client, jobbroker.WorkerOptions{Concurrency: 1, Prefetch: 2})
		w.HandleFunc(queue, func(ctx context.Context, job *jobbroker.Job) error {
			if err := appendLine(logPath, "start "+job.ID); err != nil {
				return err
			}
			time.Sleep(1500 * time.Millisecond)
			return appendLine(logPath, "end "+job.ID)
		})
	case "steps":
		// A 3-step job, 1 s leases so that a killed worker's job comes back quickly.
		w = jobbroker.NewWorker(client, jobbroker.WorkerOptions{LeaseDuration: time.Second})
		w.HandleFunc(queue, func(ctx context.Context, job *jobbroker.Job) error {
			pid := strconv.Itoa(os.Getpid())
			acct, err := jobbroker.Step(ctx, job, "create-account", func(ctx context.Context) (account, error) {
				return account{UserID: "u-" + job.Text(), Plan: "pro"}, appendLine(logPath, "step1 "+pid)
			})
			if err != nil {
				return err
			}
			n, err := jobbroker.Step(ctx, job, "count-seats", func(ctx context.Context) (int, error) {
				return 42, appendLine(logPath, "step2 "+pid)
			})
			if err != nil {
				return err
			}
			msg, err := jobbroker.Step(ctx, job, "send-welcome", func(ctx context.Context) (string, error) {
				if err := appendLine(logPath, "step3 "+pid); err != nil {
					return "", err
				}
				if hang {
					<-ctx.Done() // the test kills us here
					return "", context.Cause(ctx)
				}
				return fmt.Sprintf("welcome %s (%s, %d seats)", acct.UserID, acct.Plan, n), nil
			})
			if err != nil {
				return err
			}
			return job.SetResultJSON(msg)
		})
	case "lost":
		// 1 s leases; attempt 1 waits for its cancellation (the test freezes the process past
		// its lease) and then fails, which the worker must not send.
		w = jobbroker.NewWorker(client, jobbroker.WorkerOptions{LeaseDuration: time.Second})
		w.HandleFunc(queue, func(ctx context.Context, job *jobbroker.Job) error {
			if err := appendLine(logPath, fmt.Sprintf("start %d", job.Attempt)); err != nil {
				return err
			}
			if job.Attempt > 1 {
				return nil
			}
			<-ctx.Done()
			if err := appendLine(logPath, fmt.Sprintf("cancelled %d %v", job.Attempt, context.Cause(ctx))); err != nil {
				return err
			}
			return errors.New("ignored the lost lease")
		})
	default:
		fmt.Fprintln(os.Stderr, "unknown child mode", mode)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	err = w.Run(ctx)
	st := w.Stats()
	if err := appendLine(logPath, fmt.Sprintf("stats acked=%d failed=%d released=%d", st.Acked, st.Failed, st.Released)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	return 0
}

type child struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// startChild runs this test binary as a worker process in the given mode.
func startChild(t *testing.T, mode, queue, logPath string, extraEnv ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		childModeEnv+"="+mode, childAddrEnv+"="+shared.addr, childQueueEnv+"="+queue, childLogEnv+"="+logPath)
	cmd.Env = append(cmd.Env, extraEnv...)
	stderr, err := os.Create(logPath + ".stderr")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	go func() { c.err = cmd.Wait(); stderr.Close(); close(c.done) }()
	t.Cleanup(func() {
		select {
		case <-c.done:
		default:
			cmd.Process.Kill()
			<-c.done
		}
		if t.Failed() {
			if data, _ := os.ReadFile(logPath + ".stderr"); len(data) > 0 {
				t.Logf("child %d stderr:\n%s", cmd.Process.Pid, data)
			}
		}
	})
	return c
}

// wait waits for the child to exit and returns its exit code (-1 if killed by a signal).
func (c *child) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(60 * time.Second):
		t.Fatal("child worker did not exit")
	}
	return c.cmd.ProcessState.ExitCode()
}
