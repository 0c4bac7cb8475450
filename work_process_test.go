//go:build unix

package troupe_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
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
// $JOURNAL (at $RATE a second, if set), saying "SENT n" after each, then
// waits for all to be confirmed and says "DONE"; as home (=home) it is
// the registrar with the collector, for TestWorkUnderRealPartitions.
// $TROUPE_HELPER_LISTEN overrides its listen address.
func TestHelperWorkProcess(t *testing.T) {
	t.Parallel()
	role := os.Getenv("TROUPE_HELPER_WORK")
	if role == "" {
		t.Skip("helper for TestWorkSurvivesKillsOfWorkersAndProducer")
	}
	life := time.Minute
	if d, err := time.ParseDuration(os.Getenv("TROUPE_HELPER_LIFE")); err == nil {
		life = d
	}
	ctx, cancel := context.WithTimeout(context.Background(), life)
	defer cancel()
	cfg := workProcessConfig(role, os.Getenv("TROUPE_HELPER_REG"))
	if l := os.Getenv("TROUPE_HELPER_LISTEN"); l != "" {
		cfg.Listen = []string{l}
	}
	n, err := troupe.Start(ctx, cfg)
	if err != nil {
		fmt.Println("ERR", err)
		return
	}
	defer n.Close()
	switch role {
	case "home":
		// The registrar and the collector, for the test in another
		// namespace: "COUNT n" on stdin asks which of jobs 1..n have no
		// result, answered "MISSING k first...".
		var mu sync.Mutex
		runs := map[int]int{}
		if _, err := troupe.Spawn(n, "collector", troupe.Behavior[processed]{
			Receive: func(_ *troupe.Context[processed], p processed) {
				mu.Lock()
				runs[p.N]++
				mu.Unlock()
			}}); err != nil {
			fmt.Println("ERR", err)
			return
		}
		fmt.Println("READY", n.Addrs()[0].String())
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			c, ok := strings.CutPrefix(sc.Text(), "COUNT ")
			if !ok {
				continue
			}
			total, _ := strconv.Atoi(c)
			mu.Lock()
			var missing []string
			twice := 0
			for i := 1; i <= total; i++ {
				if runs[i] == 0 {
					missing = append(missing, strconv.Itoa(i))
				}
				if runs[i] > 1 {
					twice++
				}
			}
			mu.Unlock()
			fmt.Println("MISSING", len(missing), twice, strings.Join(missing[:min(10, len(missing))], " "))
		}
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
		fmt.Println("READY", n.Addrs()[0].String())
		<-ctx.Done()
	case "producer":
		p, err := troupe.Produce(n, tasksKey, troupe.WorkConfig{Journal: os.Getenv("TROUPE_HELPER_JOURNAL"), Window: 100})
		if err != nil {
			fmt.Println("ERR", err)
			return
		}
		from, _ := strconv.Atoi(os.Getenv("TROUPE_HELPER_FROM"))
		to, _ := strconv.Atoi(os.Getenv("TROUPE_HELPER_TO"))
		var pace *time.Ticker // $TROUPE_HELPER_RATE jobs a second, if set
		if rate, _ := strconv.Atoi(os.Getenv("TROUPE_HELPER_RATE")); rate > 0 {
			pace = time.NewTicker(time.Second / time.Duration(rate))
			defer pace.Stop()
		}
		fmt.Println("ADDR", n.Addrs()[0].String())
		fmt.Println("RECOVERED", p.Stats().Recovered)
		for i := from; i <= to; i++ {
			if pace != nil {
				<-pace.C
			}
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
		st := p.Stats()
		fmt.Println("STATS", st.Sent, st.Recovered, st.Confirmed, st.Redelivered)
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
	// Three processes under -race on a loaded machine, two kills and a
	// recovery: a bound for the whole, not a timing assertion.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
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
	awaitResults(&mu, runs, total)

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

// Work pulling across processes under a random schedule of real faults
// (seeded; the seed is logged, and $TROUPE_WORK_SEED replays it): kill -9
// of a worker (a new one starts) and of the producer (a new one starts on
// the journal, sending the rest), SIGSTOP of a worker past the failure
// window (it is given up on, then replaced) or within it, of the producer
// within it, and resets of a process's connections (ss -K). Then the
// faults stop and the last producer sends the rest: every job whose Send
// returned is processed at least once, each producer's jobs are
// confirmed, and the journal ends empty. It reports the counts.
func TestWorkUnderRandomFaults(t *testing.T) {
	t.Parallel()
	slowTest(t)
	if _, err := exec.LookPath("ss"); err != nil {
		t.Skip("needs ss (iproute2) for the resets")
	}
	seed := time.Now().UnixNano()
	if s, err := strconv.ParseInt(os.Getenv("TROUPE_WORK_SEED"), 10, 64); err == nil {
		seed = s
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("seed %d (TROUPE_WORK_SEED replays the schedule)", seed)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := l.Addr().String()
	l.Close()
	life := workFaultsDuration() + 90*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), life)
	defer cancel()
	home, err := troupe.Start(ctx, workProcessConfig("home", reg))
	if err != nil {
		t.Fatal(err)
	}
	defer home.Close()
	var mu sync.Mutex
	runs := map[int]int{}
	if _, err := troupe.Spawn(home, "collector", troupe.Behavior[processed]{
		Receive: func(_ *troupe.Context[processed], p processed) {
			mu.Lock()
			runs[p.N]++
			mu.Unlock()
		}}); err != nil {
		t.Fatal(err)
	}
	env := func(kv ...string) []string { return append(kv, fmt.Sprint("TROUPE_HELPER_LIFE=", life)) }
	type proc struct {
		cmd   *exec.Cmd
		lines <-chan string
		port  string
	}
	expect := func(p *proc, prefix string) (string, bool) {
		for {
			select {
			case l, ok := <-p.lines:
				if !ok {
					return "", false
				}
				if strings.HasPrefix(l, "ERR") {
					t.Fatalf("helper: %s", l)
				}
				if rest, ok := strings.CutPrefix(l, prefix); ok {
					return strings.TrimSpace(rest), true
				}
			case <-ctx.Done():
				t.Fatalf("no %s from a helper", prefix)
			}
		}
	}
	portOf := func(addr string) string { return addr[strings.LastIndex(addr, ":")+1:] }
	startWorker := func() *proc {
		cmd, lines := workHelper(t, "worker", reg, env()...)
		p := &proc{cmd: cmd, lines: lines}
		addr, ok := expect(p, "READY")
		if !ok {
			t.Fatal("a worker ended before it was ready")
		}
		p.port = portOf(addr)
		return p
	}
	journal := t.TempDir()
	// The jobs are paced to run through the faults: 400 a second, until
	// a second after they stop.
	const rate = 400
	total := rate * int((workFaultsDuration() + time.Second).Seconds())
	sent := 0 // the last job whose Send returned, of the producers so far
	var prodStats []string
	startProducer := func() *proc {
		cmd, lines := workHelper(t, "producer", reg, env("TROUPE_HELPER_JOURNAL="+journal, fmt.Sprint("TROUPE_HELPER_RATE=", rate),
			fmt.Sprint("TROUPE_HELPER_FROM=", sent+1), fmt.Sprint("TROUPE_HELPER_TO=", total))...)
		p := &proc{cmd: cmd, lines: lines}
		addr, ok := expect(p, "ADDR")
		if !ok {
			t.Fatal("a producer ended before it started")
		}
		p.port = portOf(addr)
		return p
	}
	// drain reads what a producer said up to now (or, once it has ended,
	// all of it), following its SENT lines.
	drain := func(p *proc, all bool) {
		for {
			var l string
			var ok bool
			if all {
				l, ok = <-p.lines
			} else {
				select {
				case l, ok = <-p.lines:
				default:
					return
				}
			}
			if !ok {
				return
			}
			if s, found := strings.CutPrefix(l, "SENT "); found {
				sent, _ = strconv.Atoi(s)
			}
			if s, found := strings.CutPrefix(l, "STATS "); found {
				prodStats = append(prodStats, s)
			}
		}
	}
	workers := []*proc{startWorker(), startWorker(), startWorker()}
	prod := startProducer()
	counts := map[string]int{}
	for end := time.Now().Add(workFaultsDuration()); time.Now().Before(end); {
		time.Sleep(time.Duration(200+rng.IntN(500)) * time.Millisecond)
		drain(prod, false)
		i := rng.IntN(len(workers))
		switch f := rng.IntN(6); f {
		case 0:
			counts["kill a worker"]++
			workers[i].cmd.Process.Signal(syscall.SIGKILL)
			workers[i] = startWorker()
		case 1:
			long := rng.IntN(2) == 0
			d := time.Duration(200+rng.IntN(500)) * time.Millisecond
			if long {
				d = 1500*time.Millisecond + time.Duration(rng.IntN(500))*time.Millisecond
				counts["pause a worker past the window"]++
			} else {
				counts["pause a worker"]++
			}
			workers[i].cmd.Process.Signal(syscall.SIGSTOP)
			time.Sleep(d)
			workers[i].cmd.Process.Signal(syscall.SIGCONT)
			if long { // given up on: quarantined, of no more use
				workers[i].cmd.Process.Signal(syscall.SIGKILL)
				workers[i] = startWorker()
			}
		case 2:
			counts["reset a worker's connections"]++
			exec.Command("ss", "-K", fmt.Sprintf("( sport = :%s or dport = :%s )", workers[i].port, workers[i].port)).Run()
		case 3:
			counts["reset the producer's connections"]++
			exec.Command("ss", "-K", fmt.Sprintf("( sport = :%s or dport = :%s )", prod.port, prod.port)).Run()
		case 4:
			counts["kill the producer"]++
			prod.cmd.Process.Signal(syscall.SIGKILL)
			prod.cmd.Wait()
			drain(prod, true)
			prod = startProducer()
		case 5:
			counts["pause the producer"]++
			prod.cmd.Process.Signal(syscall.SIGSTOP)
			time.Sleep(time.Duration(100+rng.IntN(300)) * time.Millisecond)
			prod.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	t.Logf("faults: %v", counts)
	// The faults stop; the producer finishes (a producer that has
	// ended, as one that met a reset mid-Send could, is started again).
	finished := func(p *proc) bool { // follows p to its DONE, or its end
		for {
			select {
			case l, ok := <-p.lines:
				if !ok {
					return false
				}
				if strings.HasPrefix(l, "ERR") {
					t.Fatalf("producer: %s", l)
				}
				if s, found := strings.CutPrefix(l, "SENT "); found {
					sent, _ = strconv.Atoi(s)
				}
				if s, found := strings.CutPrefix(l, "STATS "); found {
					prodStats = append(prodStats, s)
				}
				if l == "DONE" {
					return true
				}
			case <-ctx.Done():
				t.Fatal("the last producer did not finish")
			}
		}
	}
	for !finished(prod) {
		prod.cmd.Wait()
		prod = startProducer()
	}
	if sent != total {
		t.Fatalf("the last producer finished at job %d of %d", sent, total)
	}
	awaitResults(&mu, runs, sent)
	mu.Lock()
	var missing []int
	twice := 0
	for i := 1; i <= sent; i++ {
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
	t.Logf("%d jobs sent and processed, %d more than once; the last producer's stats (sent, recovered, confirmed, redelivered): %s", sent, twice, strings.Join(prodStats, "; "))
	checkConfirmedOnce(t, prodStats[len(prodStats)-1])
	p, err := troupe.Produce(home, tasksKey, troupe.WorkConfig{Journal: journal})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if r := p.Stats().Recovered; r != 0 {
		t.Fatalf("the journal holds %d jobs after all were confirmed", r)
	}
}

// awaitResults waits, a bounded while, until the collector has a result
// for each of jobs 1..n: a job's result and its confirmation travel
// different ways (to this process, to the producer's), so the last
// results may still be on theirs when the producer is done.
func awaitResults(mu *sync.Mutex, runs map[int]int, n int) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		all := true
		for i := 1; i <= n && all; i++ {
			all = runs[i] > 0
		}
		mu.Unlock()
		if all {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
