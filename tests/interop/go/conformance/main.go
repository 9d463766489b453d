// Command conformance is the Go conformance worker of tests/interop/CONFORMANCE.md: the shortest
// program, written against jobbroker.Worker, that reaches every behaviour the harness
// (tests/interop/conformance.py) checks. The payload of each job says what its handler does;
// what happened is appended to --events, one JSON object per line.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"jobbroker.dev/client/go/jobbroker"
)

type options struct {
	address, queues, events string
	concurrency, prefetch   int
	leaseMS, graceMS        int
	dieAtStep, dieAfterUser string
	outbox, langName        string
	idempotent              bool
	ca, cert, key, token    string
}

// payload is every action's fields; each action reads its own.
type payload struct {
	Action        string          `json:"action"`
	Echo          json.RawMessage `json:"echo"`
	MS            int             `json:"ms"`
	OKFromAttempt int             `json:"ok_from_attempt"`
	AfterCancel   string          `json:"after_cancel"`
	Message       string          `json:"message"`
	Percent       json.RawMessage `json:"percent"`
	Gate          string          `json:"gate"`
	Steps         []string        `json:"steps"`
	User          string          `json:"user"`
}

// eventLog appends events; each line is one write on an O_APPEND file, so a reader never sees
// half a line and a SIGKILL loses nothing already written.
type eventLog struct {
	mu   sync.Mutex
	file *os.File
}

func (l *eventLog) write(fields map[string]any) {
	line, err := json.Marshal(fields)
	if err != nil {
		panic(err) // only strings and numbers go in
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.file.Write(append(line, '\n')); err != nil {
		fmt.Fprintln(os.Stderr, "conformance: writing an event:", err)
	}
}

func (l *eventLog) job(event string, job *jobbroker.Job, extra map[string]any) {
	fields := map[string]any{"event": event, "job": job.ID, "attempt": job.Attempt}
	for k, v := range extra {
		fields[k] = v
	}
	l.write(fields)
}

func killSelf() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}

// conformance holds what the handlers share.
type conformance struct {
	opts    options
	events  *eventLog
	mu      sync.Mutex
	snoozed map[string]bool // job ids this process has snoozed once
	outbox  sync.Mutex      // one provider write at a time
}

func (c *conformance) handler(queue string) jobbroker.HandlerFunc {
	return func(ctx context.Context, job *jobbroker.Job) error {
		c.events.job("start", job, map[string]any{"queue": job.Queue, "handler": queue})
		var p payload
		if err := job.DecodeJSON(&p); err != nil {
			return jobbroker.Permanentf("payload is not JSON: %v", err)
		}
		ok := func() error {
			echo := p.Echo
			if len(echo) == 0 {
				echo = json.RawMessage("null")
			}
			if err := job.SetResultJSON(map[string]any{"queue": queue, "echo": echo}); err != nil {
				return err
			}
			c.events.job("done", job, nil)
			return nil
		}
		cancelled := func() error {
			c.events.job("cancelled", job, nil)
			return context.Cause(ctx)
		}
		// ok_from_attempt absent: never ok.
		beforeOK := p.OKFromAttempt == 0 || job.Attempt < p.OKFromAttempt

		switch p.Action {
		case "ok":
			return ok()
		case "sleep":
			select {
			case <-time.After(time.Duration(p.MS) * time.Millisecond):
				return ok()
			case <-ctx.Done():
				return cancelled()
			}
		case "wait_cancel":
			if !beforeOK {
				return ok()
			}
			<-ctx.Done()
			if p.AfterCancel == "return" {
				// The work was done after all: a normal return, which the library acks.
				c.events.job("cancelled", job, nil)
				return ok()
			}
			return cancelled()
		case "ignore_cancel":
			if beforeOK {
				// A handler stuck in a blocking call: a sleep that does not look at ctx.
				time.Sleep(time.Duration(p.MS) * time.Millisecond)
			}
			return ok()
		case "fail":
			if !beforeOK {
				return ok()
			}
			return errors.New(p.Message)
		case "permanent":
			return jobbroker.Permanent(errors.New(p.Message))
		case "retry_after":
			if job.Attempt == 1 {
				return jobbroker.RetryAfter(time.Duration(p.MS)*time.Millisecond, errors.New(p.Message))
			}
			return ok()
		case "snooze":
			c.mu.Lock()
			first := !c.snoozed[job.ID]
			c.snoozed[job.ID] = true
			c.mu.Unlock()
			if first {
				return jobbroker.Snooze(time.Duration(p.MS) * time.Millisecond)
			}
			return ok()
		case "progress":
			if err := job.SetProgressJSON(map[string]json.RawMessage{"percent": p.Percent}); err != nil {
				return err
			}
			for {
				if _, err := os.Stat(p.Gate); err == nil {
					return ok()
				}
				select {
				case <-time.After(20 * time.Millisecond):
				case <-ctx.Done():
					return cancelled()
				}
			}
		case "steps":
			return c.steps(ctx, job, p.Steps)
		case "signup":
			return c.signup(job, p.User, ok)
		}
		return jobbroker.Permanentf("unknown action %q", p.Action)
	}
}

// steps runs one durable step per name; the result is the steps' results by name.
func (c *conformance) steps(ctx context.Context, job *jobbroker.Job, names []string) error {
	results := map[string]any{}
	for _, name := range names {
		v, err := jobbroker.Step(ctx, job, name, func(ctx context.Context) (map[string]any, error) {
			c.events.job("step", job, map[string]any{"step": name})
			if name == c.opts.dieAtStep {
				killSelf()
			}
			return map[string]any{"by": c.opts.langName, "step": name}, nil
		})
		if err != nil {
			return err
		}
		results[name] = v
	}
	if err := job.SetResultJSON(results); err != nil {
		return err
	}
	c.events.job("done", job, nil)
	return nil
}

// signup is the sign-up example: the fake email provider appends to the outbox, and with
// --idempotent it remembers the keys it has seen (as a real provider's idempotency keys do).
func (c *conformance) signup(job *jobbroker.Job, user string, ok func() error) error {
	key := fmt.Sprintf("%s/%d", job.ID, job.Attempt)
	if c.opts.idempotent {
		key = job.IdempotencyKey
	}
	if err := c.sendEmail(user, key); err != nil {
		return err
	}
	if user == c.opts.dieAfterUser {
		killSelf()
	}
	return ok()
}

func (c *conformance) sendEmail(user, key string) error {
	c.outbox.Lock()
	defer c.outbox.Unlock()
	if c.opts.idempotent {
		seen, err := outboxHasKey(c.opts.outbox, key)
		if err != nil || seen {
			return err
		}
	}
	line, err := json.Marshal(map[string]string{"user": user, "key": key})
	if err != nil {
		return err
	}
	f, err := os.OpenFile(c.opts.outbox, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Write(append(line, '\n')); err != nil {
		return err
	}
	return f.Sync()
}

func outboxHasKey(path, key string) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var entry struct{ Key string }
		if json.Unmarshal(sc.Bytes(), &entry) == nil && entry.Key == key {
			return true, nil
		}
	}
	return false, sc.Err()
}

func parseFlags() options {
	var o options
	flag.StringVar(&o.address, "address", "", "the broker, HOST:PORT[,HOST:PORT...] (a cluster's nodes)")
	flag.StringVar(&o.queues, "queues", "", "Q1,Q2,...: one handler per queue")
	flag.StringVar(&o.events, "events", "", "file the events are appended to")
	flag.IntVar(&o.concurrency, "concurrency", 1, "handlers at once")
	flag.IntVar(&o.prefetch, "prefetch", 0, "jobs held beyond concurrency")
	flag.IntVar(&o.leaseMS, "lease-ms", 0, "lease asked for each job; 0 = the job's or the queue's")
	flag.IntVar(&o.graceMS, "grace-ms", 10000, "a graceful stop's grace")
	flag.StringVar(&o.dieAtStep, "die-at-step", "", "steps action: SIGKILL inside this step's body")
	flag.StringVar(&o.dieAfterUser, "die-after-user", "", "signup action: SIGKILL after this user's email")
	flag.StringVar(&o.outbox, "outbox", "", "signup action: the fake email provider's file")
	flag.BoolVar(&o.idempotent, "idempotent", false, "signup action: pass the idempotency key to the provider")
	flag.StringVar(&o.langName, "lang-name", "go", "written into step results")
	flag.StringVar(&o.ca, "ca", "", "connect with TLS, trusting this CA (PEM file)")
	flag.StringVar(&o.cert, "cert", "", "with --ca: the client certificate (PEM file) for mutual TLS")
	flag.StringVar(&o.key, "key", "", "with --cert: its key (PEM file)")
	flag.StringVar(&o.token, "token", "", "bearer token sent with every call")
	flag.Parse()
	if o.address == "" || o.queues == "" || o.events == "" {
		fmt.Fprintln(os.Stderr, "usage: conformance --address HOST:PORT --queues Q1,Q2 --events FILE [flags]")
		os.Exit(2)
	}
	return o
}

func main() {
	opts := parseFlags()
	file, err := os.OpenFile(opts.events, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	c := &conformance{opts: opts, events: &eventLog{file: file}, snoozed: map[string]bool{}}

	// The TLS and token flags go to the library's own client options, as a user's would.
	client, err := jobbroker.New(jobbroker.Options{
		// Several addresses are a cluster's nodes, tried in order.
		Addresses: strings.Split(opts.address, ","),
		CAFile:    opts.ca,
		CertFile:  opts.cert,
		KeyFile:   opts.key,
		Token:     opts.token,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	w := jobbroker.NewWorker(client, jobbroker.WorkerOptions{
		Concurrency:   opts.concurrency,
		Prefetch:      opts.prefetch,
		LeaseDuration: time.Duration(opts.leaseMS) * time.Millisecond,
		ShutdownGrace: time.Duration(opts.graceMS) * time.Millisecond,
	})
	for _, q := range strings.Split(opts.queues, ",") {
		w.Handle(q, c.handler(q))
	}
	// SIGTERM and SIGINT start the graceful stop. The notification is never stopped (unlike
	// signal.NotifyContext's deferred stop), so that a second signal, even one arriving after
	// Run returned, is absorbed rather than killing the process with the default action.
	ctx, stop := context.WithCancel(context.Background())
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, os.Interrupt)
	go func() { <-signals; stop() }()
	c.events.write(map[string]any{"event": "ready"})
	if err := w.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "conformance: worker:", err)
		os.Exit(1)
	}
	c.events.write(map[string]any{"event": "stopped"})
	os.Exit(0)
}
