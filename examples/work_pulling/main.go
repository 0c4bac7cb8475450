// Command work_pulling hands 600 jobs to three worker processes and kills
// one of them (kill -9) mid-run.
//
// The producer (this process, also the registrar) runs a troupe.Producer
// over the service key "jobs"; each worker process runs a troupe.Worker
// under the same key, which asks for at most five jobs at a time and
// confirms each when it has done it. When worker-2 has done 50 jobs it is
// killed: the producer, which watches every worker, hands the jobs it
// held unconfirmed to the other two as soon as its node is given up on.
// The program prints what was handed out again, and that every job was
// done: at least once — a job the killed worker had done but not yet
// confirmed is done twice, which is why jobs should be idempotent.
//
// Run it with: go run ./examples/work_pulling
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"troupe"
)

// Job is a piece of work; the worker answers with a Result.
type Job struct {
	N       int
	ReplyTo troupe.Ref[Result]
}

// Result says who did job N, and whether it came to them handed out
// again.
type Result struct {
	N      int
	Worker string
	Again  bool
}

func init() {
	troupe.SetWireKey[Job]("work_pulling.job")
	troupe.SetWireKey[Result]("work_pulling.result")
}

var jobsKey = troupe.ServiceKey[Job]{Name: "jobs"}

// workerEnv, when set, makes this program a worker process that uses the
// registry it names; nameEnv is the worker's name.
const (
	workerEnv = "WORK_PULLING_REGISTRY"
	nameEnv   = "WORK_PULLING_NAME"
)

const (
	jobs    = 600
	workers = 3
)

// config is every node's: a short failure window (2 s, the default is
// 10 s) so that the demonstration is quick.
func config(name, registry string) troupe.Config {
	return troupe.Config{Name: name, RegistryAddrs: []string{registry},
		HeartbeatInterval: 200 * time.Millisecond, UnreachableAfter: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

func main() {
	if registry := os.Getenv(workerEnv); registry != "" {
		if err := worker(registry, os.Getenv(nameEnv)); err != nil {
			log.Fatal(err)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exe, err := os.Executable()
	if err != nil {
		log.Fatal(err)
	}
	if err := run(ctx, exe, nil, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// worker runs one worker process until it is killed. It prints READY
// once its worker is registered.
func worker(registry, name string) error {
	n, err := troupe.Start(context.Background(), config(name, registry))
	if err != nil {
		return err
	}
	defer n.Close()
	_, err = troupe.Worker(n, "worker", jobsKey, troupe.Behavior[troupe.Delivery[Job]]{
		Receive: func(_ *troupe.Context[troupe.Delivery[Job]], d troupe.Delivery[Job]) {
			time.Sleep(2 * time.Millisecond) // the work
			d.Job.ReplyTo.Tell(Result{N: d.Job.N, Worker: name, Again: d.Redelivered})
			d.Confirm()
		},
	}, troupe.WorkConfig{Room: 5})
	if err != nil {
		return err
	}
	fmt.Println("READY")
	select {} // until killed
}

// results collects the workers' results.
type results struct {
	mu     sync.Mutex
	runs   map[int]int    // job → times done
	by     map[string]int // worker → jobs done
	again  []int          // jobs that came handed out again
	killAt chan struct{}  // closed when worker-2 has done 50
	all    chan struct{}  // closed when every job has a result
}

func (r *results) add(res Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if res.Again {
		r.again = append(r.again, res.N)
	}
	if r.runs[res.N]++; r.runs[res.N] == 1 && len(r.runs) == jobs {
		close(r.all)
	}
	if r.by[res.Worker]++; res.Worker == "worker-2" && r.by[res.Worker] == 50 {
		close(r.killAt)
	}
}

// run starts the producer and three worker processes (exe with args, in
// worker mode), kills worker-2 midway, and prints what happened to w.
func run(ctx context.Context, exe string, args []string, w io.Writer) error {
	dir, err := os.MkdirTemp("", "troupe-wp")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	registry := "unix://" + filepath.Join(dir, "registry.sock")
	n, err := troupe.Start(ctx, config("producer", registry))
	if err != nil {
		return err
	}
	defer n.Close()
	res := &results{runs: map[int]int{}, by: map[string]int{}, killAt: make(chan struct{}), all: make(chan struct{})}
	collector, err := troupe.Spawn(n, "results", troupe.Behavior[Result]{
		Receive: func(_ *troupe.Context[Result], r Result) { res.add(r) },
	})
	if err != nil {
		return err
	}

	procs := map[string]*exec.Cmd{}
	defer func() {
		for _, cmd := range procs {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	for i := 1; i <= workers; i++ {
		name := fmt.Sprintf("worker-%d", i)
		cmd, err := startWorker(exe, args, registry, name)
		if err != nil {
			return err
		}
		procs[name] = cmd
	}

	// A window as large as the run: Send never waits, so every worker
	// always has a full room of jobs, and worker-2 holds some when it is
	// killed.
	p, err := troupe.Produce(n, jobsKey, troupe.WorkConfig{Window: jobs})
	if err != nil {
		return err
	}
	defer p.Close()
	fmt.Fprintf(w, "producer: %d workers in %d processes, each holding at most 5 jobs\n", workers, workers)

	sent := make(chan error, 1)
	go func() {
		for i := 1; i <= jobs; i++ {
			if err := p.Send(ctx, Job{N: i, ReplyTo: collector}); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	select {
	case <-res.killAt:
	case <-ctx.Done():
		return ctx.Err()
	}
	procs["worker-2"].Process.Kill() // kill -9
	fmt.Fprintln(w, "producer: worker-2 killed (kill -9) after 50 jobs")
	if err := <-sent; err != nil {
		return err
	}
	if err := p.Wait(ctx); err != nil {
		return err
	}
	// A result and its job's confirmation travel to two actors: the last
	// results may still be on their way to the collector.
	select {
	case <-res.all:
	case <-time.After(5 * time.Second):
	case <-ctx.Done():
		return ctx.Err()
	}
	st := p.Stats()
	res.mu.Lock()
	defer res.mu.Unlock()
	lost, twice := 0, 0
	for i := 1; i <= jobs; i++ {
		switch {
		case res.runs[i] == 0:
			lost++
		case res.runs[i] > 1:
			twice++
		}
	}
	slices.Sort(res.again)
	fmt.Fprintf(w, "producer: %d jobs that worker-2 held unconfirmed were handed to the others: %v\n", st.Redelivered, res.again)
	fmt.Fprintf(w, "producer: %d jobs sent, %d confirmed, %d lost; %d done twice (done by worker-2, not confirmed before it died)\n",
		st.Sent, st.Confirmed, lost, twice)
	return nil
}

// startWorker starts a worker process and waits for its READY.
func startWorker(exe string, args []string, registry, name string) (*exec.Cmd, error) {
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), workerEnv+"="+registry, nameEnv+"="+name)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "READY" {
				ready <- true
				io.Copy(io.Discard, out)
				return
			}
		}
		ready <- false
	}()
	select {
	case ok := <-ready:
		if !ok {
			cmd.Process.Kill()
			cmd.Wait()
			return nil, errors.New(name + " ended before it was ready")
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		return nil, errors.New(name + " was not ready within 30 s")
	}
	return cmd, nil
}
