//go:build linux

package troupe_test

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"troupe/hostnet"
)

// nsProc is a helper process of TestWorkUnderRealPartitions in a host's
// network namespace.
type nsProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

func startWorkNS(t *testing.T, h *hostnet.Host, role, listen, reg string, env ...string) *nsProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := h.Command(exe, "-test.run=^TestHelperWorkProcess$")
	cmd.Env = append(append(os.Environ(), "TROUPE_HELPER_WORK="+role, "TROUPE_HELPER_REG="+reg,
		"TROUPE_HELPER_LISTEN="+listen, "TROUPE_HELPER_LIFE=10m"), env...)
	cmd.Stderr = os.Stderr
	p := &nsProc{cmd: cmd, lines: make(chan string, 1<<16)}
	p.stdin, _ = cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	return p
}

// next returns p's next line with prefix (its rest), following the SENT
// and STATS lines of a producer into sent and stats; ok is false when p
// ended first.
func (p *nsProc) next(t *testing.T, prefix string, sent *int, stats *string) (string, bool) {
	t.Helper()
	deadline := time.After(2 * time.Minute)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				return "", false
			}
			if strings.HasPrefix(l, "ERR") {
				t.Fatalf("helper: %s", l)
			}
			if s, found := strings.CutPrefix(l, "SENT "); found && sent != nil {
				*sent, _ = strconv.Atoi(s)
			}
			if s, found := strings.CutPrefix(l, "STATS "); found && stats != nil {
				*stats = s
			}
			if rest, found := strings.CutPrefix(l, prefix); found {
				return strings.TrimSpace(rest), true
			}
		case <-deadline:
			t.Fatalf("no %s from a helper", prefix)
		}
	}
}

// Work pulling across processes, each in its own network namespace,
// under a seeded schedule of real faults (workFaultsDuration, 4 s by
// default; $TROUPE_WORK_SEED replays it): nftables partitions between
// the producer and a worker and one-way cuts each way, within the
// failure window and past it (the worker, given up on, is replaced),
// kill -9 of a worker and of the producer (started again on its
// journal), SIGSTOP of a worker, and socket resets (ss -K). Jobs are
// paced through the faults; at the end every job is processed and the
// journal is empty. It needs root, ip and nft, and skips otherwise.
func TestWorkUnderRealPartitions(t *testing.T) {
	t.Parallel()
	slowTest(t)
	if why := hostnet.Available(); why != "" {
		t.Skip(why)
	}
	seed := time.Now().UnixNano()
	if s, err := strconv.ParseInt(os.Getenv("TROUPE_WORK_SEED"), 10, 64); err == nil {
		seed = s
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 2))
	t.Logf("seed %d (TROUPE_WORK_SEED replays the schedule)", seed)
	net := hostnet.New(t, 5) // h0: registrar and collector; h1: producer; h2-h4: workers
	hosts := net.Hosts
	addr := func(h *hostnet.Host, port int) string { return fmt.Sprintf("tcp://%s:%d", h.IP, port) }
	reg := addr(hosts[0], 7100)
	home := startWorkNS(t, hosts[0], "home", reg, reg)
	if _, ok := home.next(t, "READY", nil, nil); !ok {
		t.Fatal("home ended before it was ready")
	}
	workers := make([]*nsProc, 3)
	startWorker := func(i int) {
		workers[i] = startWorkNS(t, hosts[2+i], "worker", addr(hosts[2+i], 0), reg)
		if _, ok := workers[i].next(t, "READY", nil, nil); !ok {
			t.Fatal("a worker ended before it was ready")
		}
	}
	for i := range workers {
		startWorker(i)
	}
	journal := t.TempDir()
	const rate = 300
	total := rate * int((workFaultsDuration() + time.Second).Seconds())
	sent, stats := 0, ""
	var prod *nsProc
	startProducer := func() {
		prod = startWorkNS(t, hosts[1], "producer", addr(hosts[1], 0), reg, "TROUPE_HELPER_JOURNAL="+journal,
			fmt.Sprint("TROUPE_HELPER_RATE=", rate), fmt.Sprint("TROUPE_HELPER_FROM=", sent+1), fmt.Sprint("TROUPE_HELPER_TO=", total))
		if _, ok := prod.next(t, "ADDR", &sent, &stats); !ok {
			t.Fatal("a producer ended before it started")
		}
	}
	startProducer()
	drain := func() {
		for {
			select {
			case l, ok := <-prod.lines:
				if !ok {
					return
				}
				if s, found := strings.CutPrefix(l, "SENT "); found {
					sent, _ = strconv.Atoi(s)
				}
			default:
				return
			}
		}
	}
	counts := map[string]int{}
	pHost := hosts[1]
	for end := time.Now().Add(workFaultsDuration()); time.Now().Before(end); {
		time.Sleep(time.Duration(200+rng.IntN(500)) * time.Millisecond)
		drain()
		i := rng.IntN(len(workers))
		wHost := hosts[2+i]
		long := rng.IntN(3) == 0
		d := time.Duration(200+rng.IntN(500)) * time.Millisecond
		if long {
			d = 1500*time.Millisecond + time.Duration(rng.IntN(500))*time.Millisecond
		}
		replace := false
		switch rng.IntN(6) {
		case 0:
			counts[fmt.Sprint("partition, long: ", long)]++
			wHost.DropFrom(pHost)
			pHost.DropFrom(wHost)
			time.Sleep(d)
			wHost.Clear()
			pHost.Clear()
			replace = long
		case 1:
			if rng.IntN(2) == 0 {
				counts[fmt.Sprint("one-way cut from the worker, long: ", long)]++
				pHost.DropFrom(wHost)
			} else {
				counts[fmt.Sprint("one-way cut to the worker, long: ", long)]++
				wHost.DropFrom(pHost)
			}
			time.Sleep(d)
			wHost.Clear()
			pHost.Clear()
			replace = long
		case 2:
			counts["kill -9 a worker"]++
			workers[i].cmd.Process.Signal(syscall.SIGKILL)
			replace = true
		case 3:
			counts[fmt.Sprint("pause a worker, long: ", long)]++
			workers[i].cmd.Process.Signal(syscall.SIGSTOP)
			time.Sleep(d)
			workers[i].cmd.Process.Signal(syscall.SIGCONT)
			replace = long
		case 4:
			counts["reset the producer's connections"]++
			pHost.Command("ss", "-K", "state", "established").Run()
		case 5:
			counts["kill -9 the producer"]++
			prod.cmd.Process.Signal(syscall.SIGKILL)
			prod.cmd.Wait()
			for l := range prod.lines {
				if s, found := strings.CutPrefix(l, "SENT "); found {
					sent, _ = strconv.Atoi(s)
				}
			}
			startProducer()
		}
		if replace { // given up on (quarantined) or dead: a new worker process
			workers[i].cmd.Process.Signal(syscall.SIGKILL)
			workers[i].cmd.Wait()
			startWorker(i)
		}
	}
	t.Logf("faults: %v", counts)
	for {
		if _, ok := prod.next(t, "DONE", &sent, &stats); ok {
			break
		}
		prod.cmd.Wait()
		startProducer()
	}
	if sent != total {
		t.Fatalf("the last producer finished at job %d of %d", sent, total)
	}
	var missing string
	for deadline := time.Now().Add(30 * time.Second); ; {
		fmt.Fprintf(home.stdin, "COUNT %d\n", total)
		m, ok := home.next(t, "MISSING", nil, nil)
		if !ok {
			t.Fatal("home ended")
		}
		missing = m
		if strings.HasPrefix(m, "0 ") || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // (results still on their way)
	}
	if !strings.HasPrefix(missing, "0 ") {
		t.Fatalf("jobs never processed (count, done twice, first ones): %s", missing)
	}
	t.Logf("%d jobs, all processed; (missing, done twice): %s; the last producer's stats (sent, recovered, confirmed, redelivered): %s", total, missing, stats)
	checkConfirmedOnce(t, stats)
	prod.stdin.Close()
	prod.cmd.Wait() // (its lock on the journal goes with it)
	checkJournalEmpty(t, journal)
}
