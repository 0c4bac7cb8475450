// Command supervision shows a worker that fails on some inputs and a
// parent that keeps it going: the worker is restarted with a backoff, with
// fresh state each time, until it has failed more often than its limit
// allows; then it stops for good and the parent hears why.
//
// What to watch: the run number. Each restart builds the worker again, so
// its count of jobs starts over; the jobs sent while it was pausing are not
// lost, they wait in its mailbox for the restarted worker. The last job
// never runs: the worker is gone by then.
//
// Run it with: go run ./examples/supervision
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"troupe"
)

// Job is a number to square, as text that may not be a number.
type Job struct {
	Input   string
	ReplyTo troupe.Ref[Report]
}

// Report is what the worker tells its parent: a result, or that it is
// about to restart.
type Report struct {
	Text string
}

// newWorker builds the worker's state afresh: Supervise calls it once at
// spawn and again at every restart.
func newWorker(runs *atomic.Int32) func() troupe.Behavior[Job] {
	return func() troupe.Behavior[Job] {
		run := runs.Add(1)
		jobs := 0 // the state a restart throws away
		var parent troupe.Ref[Report]
		return troupe.Behavior[Job]{
			Receive: func(_ *troupe.Context[Job], j Job) {
				parent = j.ReplyTo
				n, err := strconv.Atoi(j.Input)
				if err != nil {
					panic(fmt.Sprintf("bad input %q", j.Input))
				}
				jobs++
				j.ReplyTo.Tell(Report{Text: fmt.Sprintf("%d squared is %d (worker run %d, job %d of the run)", n, n*n, run, jobs)})
			},
			Signal: func(_ *troupe.Context[Job], s troupe.Signal) {
				// The last word of a run that failed, before its state goes.
				if pr, ok := s.(troupe.PreRestart); ok && !parent.IsZero() {
					parent.Tell(Report{Text: fmt.Sprintf("worker run %d failed (%v); it restarts after a pause", run, pr.Reason)})
				}
			},
		}
	}
}

// parent spawns the supervised worker, hands it the inputs, prints what it
// hears, and closes done when the worker has stopped for good.
func parent(inputs []string, w io.Writer, done chan<- struct{}) troupe.Behavior[Report] {
	var runs atomic.Int32
	return troupe.Behavior[Report]{
		Setup: func(c *troupe.Context[Report]) {
			strategy := troupe.RestartWithBackoff(20*time.Millisecond, time.Second, 0.2).
				WithLimit(2, time.Minute) // the third failure within a minute stops it
			worker, err := troupe.Spawn(c, "worker", troupe.Supervise(newWorker(&runs), strategy))
			if err != nil {
				panic(err)
			}
			c.Watch(worker) // a restart is not a stop: only the final stop is signalled
			for _, in := range inputs {
				worker.Tell(Job{Input: in, ReplyTo: c.Self()})
			}
		},
		Receive: func(_ *troupe.Context[Report], r Report) {
			fmt.Fprintln(w, "parent:", r.Text)
		},
		Signal: func(_ *troupe.Context[Report], s troupe.Signal) {
			if t, ok := s.(troupe.Terminated); ok {
				var pe *troupe.PanicError
				if troupe.IsFailure(t.Reason) && errors.As(t.Reason, &pe) {
					fmt.Fprintf(w, "parent: the worker stopped for good, failing on %v\n", pe.Value)
				}
				close(done)
			}
		},
	}
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := run(ctx, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, w io.Writer) error {
	// The node logs each failure with its stack; this demonstration
	// prints only what the parent sees.
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	n, err := troupe.Start(ctx, troupe.Config{Logger: quiet})
	if err != nil {
		return err
	}
	defer n.Close()
	done := make(chan struct{})
	inputs := []string{"3", "4", "oops", "5", "x", "6", "?", "7"}
	if _, err := troupe.Spawn(n, "parent", parent(inputs, w, done)); err != nil {
		return err
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
