// Command worker is the Go interop worker: it runs durable steps "a", "b", "c" for every job of
// -queue. Each step appends "<lang-name> <step>" to -record (fsynced) and returns a JSON value;
// with -die-at STEP the process SIGKILLs itself right after recording that step. The job's
// result is {"a": ..., "b": ..., "c": ...} as jobbroker.Step returned them.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"jobbroker.dev/client/go/jobbroker"
)

var steps = []string{"a", "b", "c"}

// stepValue must match expected_step() in ../steps_interop.py and the other workers.
func stepValue(lang, step string, n int) map[string]any {
	return map[string]any{
		"by":   lang,
		"step": step,
		"n":    n,
		"nested": map[string]any{
			"half": float64(n) + 0.5,
			"list": []any{n, "x", true, nil},
			"text": "h\u00e9llo \u2713",
		},
	}
}

func record(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		return err
	}
	return f.Sync()
}

func main() {
	address := flag.String("address", "", "broker HOST:PORT")
	queue := flag.String("queue", "", "queue to work")
	recordPath := flag.String("record", "", "file that step executions are appended to")
	lang := flag.String("lang-name", "", "name written in the record and the results")
	dieAt := flag.String("die-at", "", "step after which the process SIGKILLs itself")
	flag.Parse()
	if *address == "" || *queue == "" || *recordPath == "" || *lang == "" {
		log.Fatal("usage: worker --address HOST:PORT --queue Q --record FILE --lang-name NAME [--die-at STEP]")
	}

	client, err := jobbroker.NewClient(*address)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	w := jobbroker.NewWorker(client, jobbroker.WorkerOptions{Concurrency: 1})
	w.HandleFunc(*queue, func(ctx context.Context, job *jobbroker.Job) error {
		results := map[string]any{}
		for i, step := range steps {
			v, err := jobbroker.Step(ctx, job, step, func(ctx context.Context) (map[string]any, error) {
				if err := record(*recordPath, *lang+" "+step); err != nil {
					return nil, fmt.Errorf("record: %w", err)
				}
				if step == *dieAt {
					_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
					select {} // the signal is on its way
				}
				return stepValue(*lang, step, i+1), nil
			})
			if err != nil {
				return err
			}
			results[step] = v
		}
		return job.SetResultJSON(results)
	})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
