//go:build unix

package troupe_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"troupe"
)

// processed is what a worker process reports for each job it did.
type processed struct {
	N   int
	Pid int
}

func init() { troupe.SetWireKey[processed]("troupe.test.work.processed") }

// workProcessConfig is the config of every node of the process test:
// loopback TCP, the registry at reg, a short failure window.
func workProcessConfig(name, reg string) troupe.Config {
	return troupe.Config{Name: name, Listen: []string{"tcp://127.0.0.1:0"}, RegistryAddrs: []string{reg},
		HeartbeatInterval: 50 * time.Millisecond, UnreachableAfter: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// TestHelperWorkProcess is not a test: TestWorkSurvivesKillsOfWorkersAndProducer
// runs it in child processes. As a worker ($TROUPE_HELPER_WORK=worker) it
// reports each job to the test's "collector" and confirms it; as a
// producer (=producer) it sends jobs $FROM..$TO with the journal
// $JOURNAL, saying "SENT n" after each, then waits for all to be
// confirmed and says "DONE".
func TestHelperWorkProcess(t *testing.T) {
	t.Parallel()
	role := os.Getenv("TROUPE_HELPER_WORK")
	if role == "" {
		t.Skip("helper for TestWorkSurvivesKillsOfWorkersAndProducer")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := troupe.Start(ctx, workProcessConfig(role, os.Getenv("TROUPE_HELPER_REG")))
	if err != nil {
		fmt.Println("ERR", err)
		return
	}
	defer n.Close()
	switch role {
	case "worker":
		collector, err := troupe.WaitForActor[processed](ctx, n, "collector")
		if err != nil {
			fmt.Println("ERR", err)
			return
		}
		pid := os.Getpid()
		_, err = troupe.Worker(n, "worker", tasksKey, troupe.Behavior[troupe.Delivery[task]]{
			Receive: func(_ *troupe.Context[troupe.Delivery[task]], d troupe.Delivery[task]) {
				collector.Tell(processed{N: d.Job.N, Pid: pid})
				time.Sleep(time.Millisecond) // a job takes a moment
				d.Confirm()
			}}, troupe.WorkConfig{Room: 5})
		if err != nil {
			fmt.Println("ERR", err)
			return
		}
		fmt.Println("READY")
		<-ctx.Done()
	case "producer":
		p, err := troupe.Produce(n, tasksKey, troupe.WorkConfig{Journal: os.Getenv("TROUPE_HELPER_JOURNAL"), Window: 100})
		if err != nil {
			fmt.Println("ERR", err)
			return
		}
		from, _ := strconv.Atoi(os.Getenv("TROUPE_HELPER_FROM"))
		to, _ := strconv.Atoi(os.Getenv("TROUPE_HELPER_TO"))
		fmt.Println("RECOVERED", p.Stats().Recovered)
		for i := from; i <= to; i++ {
			if err := p.Send(ctx, task{N: i, Body: make([]byte, 512)}); err != nil {
				fmt.Println("ERR", err)
				return
			}
			fmt.Println("SENT", i)
		}
		if err := p.Wait(ctx); err != nil {
			fmt.Println("ERR", err)
			return
		}
		p.Close()
		fmt.Println("DONE")
	}
}

// workHelper starts a helper process in role and returns its lines.
func workHelper(t *testing.T, role, reg string, env ...string) (*exec.Cmd, <-chan string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestHelperWorkProcess$")
	cmd.Env = append(append(os.Environ(), "TROUPE_HELPER_WORK="+role, "TROUPE_HELPER_REG="+reg), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := make(chan string, 4096)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return cmd, lines
}

// Work pulling across processes, with kill -9 of a worker mid-run and of
// the producer mid-run: the producer started again on the same journal
// hands out what was unconfirmed, every job whose Send returned is
// processed at least once, and the journal ends empty.
func TestWorkSurvivesKillsOfWorkersAndProducer(t *testing.T) {
	t.Parallel()
	slowTest(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := l.Addr().String()
	l.Close()
	ctx := ctxFor(t)
	home, err := troupe.Start(ctx, workProcessConfig("home", reg))
	if err != nil {
		t.Fatal(err)
	}
	defer home.Close()
	var mu sync.Mutex
	runs := map[int]int{}
	first := make(chan int, 1) // a pid that has done 50 jobs
	byPid := map[int]int{}
	if _, err := troupe.Spawn(home, "collector", troupe.Behavior[processed]{
		Receive: func(_ *troupe.Context[processed], p processed) {
			mu.Lock()
			defer mu.Unlock()
			runs[p.N]++
			if byPid[p.Pid]++; byPid[p.Pid] == 50 {
				select {
				case first <- p.Pid:
				default:
				}
			}
		}}); err != nil {
		t.Fatal(err)
	}
	expect := func(lines <-chan string, prefix string) string {
		t.Helper()
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("the helper ended before saying %s", prefix)
				}
				if strings.HasPrefix(l, "ERR") {
					t.Fatalf("helper: %s", l)
				}
				if strings.HasPrefix(l, prefix) {
					return l
				}
			case <-ctx.Done():
				t.Fatalf("no %s from the helper", prefix)
			}
		}
	}
	workers := map[int]*exec.Cmd{}
	for range 3 {
		cmd, lines := workHelper(t, "worker", reg)
		expect(lines, "READY")
		workers[cmd.Process.Pid] = cmd
	}
	journal := t.TempDir()
	const total = 1500
	prod, plines := workHelper(t, "producer", reg, "TROUPE_HELPER_JOURNAL="+journal, "TROUPE_HELPER_FROM=1", fmt.Sprint("TROUPE_HELPER_TO=", total))

	// A worker that has done 50 jobs is killed; then the producer, once
	// it has sent 600.
	pid := <-first
	workers[pid].Process.Signal(syscall.SIGKILL)
	sent := 0
	for sent < 600 {
		l := expect(plines, "SENT")
		sent, _ = strconv.Atoi(strings.TrimPrefix(l, "SENT "))
	}
	prod.Process.Signal(syscall.SIGKILL)
	prod.Wait()
	for l := range plines { // what it said before it died
		if s, ok := strings.CutPrefix(l, "SENT "); ok {
			sent, _ = strconv.Atoi(s)
		}
	}
	_, plines = workHelper(t, "producer", reg, "TROUPE_HELPER_JOURNAL="+journal, fmt.Sprint("TROUPE_HELPER_FROM=", sent+1), fmt.Sprint("TROUPE_HELPER_TO=", total))
	rec := expect(plines, "RECOVERED")
	expect(plines, "DONE")

	mu.Lock()
	var missing []int
	twice := 0
	for i := 1; i <= total; i++ {
		if runs[i] == 0 {
			missing = append(missing, i)
		}
		if runs[i] > 1 {
			twice++
		}
	}
	mu.Unlock()
	if len(missing) > 0 {
		t.Fatalf("%d jobs were never processed: %v", len(missing), missing[:min(10, len(missing))])
	}
	t.Logf("%d jobs; the first producer was killed after sending %d, the second %s; %d jobs ran more than once", total, sent, strings.ToLower(rec), twice)
	p, err := troupe.Produce(home, tasksKey, troupe.WorkConfig{Journal: journal})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if r := p.Stats().Recovered; r != 0 {
		t.Fatalf("the journal holds %d jobs after all were confirmed", r)
	}
}
