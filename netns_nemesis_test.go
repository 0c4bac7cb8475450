//go:build linux

package troupe

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"troupe/hostnet"
)

// TestNemesisProcesses is the nemesis with real processes and real faults:
// five members, each a separate OS process in its own network namespace,
// under a seeded random schedule of nftables partitions (clean, partial,
// one-way), SIGSTOP/SIGCONT pauses shorter and longer than the windows,
// kill -9, restarts at the same address, socket resets (ss -K), graceful
// shutdowns and heals. Every member reports its view every 25 ms; the test
// fails the moment two running up members have each written the other off,
// and at the end, healed and restarted, the members must converge on one
// leader. TROUPE_NEMESIS_DURATION and TROUPE_NEMESIS_SEED as for
// TestNemesis; it needs root, ip and nft, and skips otherwise.
func TestNemesisProcesses(t *testing.T) {
	longRun(t, "TROUPE_NEMESIS_DURATION", "TROUPE_NEMESIS_SEED")
	t.Parallel() // beside the in-process nemesis: CI's step runs both at once
	if why := hostnet.Available(); why != "" {
		t.Skip(why)
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("TROUPE_NEMESIS_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("TROUPE_NEMESIS_SEED=%q: %v", s, err)
		}
	}
	run := 15 * time.Second
	if s := os.Getenv("TROUPE_NEMESIS_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatal(err)
		}
		run = d
	} else if testing.Short() {
		run = 5 * time.Second
	}
	z := &procNemesis{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x7e57)), views: map[string]procView{},
		seen: map[string]map[string]bool{}, off: map[string]map[string]bool{},
		gone: map[string]bool{}, stoppedNow: map[string]bool{}}
	t.Logf("seed %d (TROUPE_NEMESIS_SEED=%d replays it), %v", seed, seed, run)
	z.net = hostnet.New(t, 5)
	for i := range 5 {
		z.slots = append(z.slots, &procSlot{host: z.net.Hosts[i], name: fmt.Sprintf("h%d", i)})
	}
	z.slots[0].start(z, "-")
	for _, s := range z.slots[1:] {
		s.start(z, z.slots[0].node.addr)
	}
	z.waitConverged(30 * time.Second)
	defer func() {
		if t.Failed() {
			t.Logf("the schedule:\n%s", strings.Join(z.schedule, "\n"))
			t.Logf("FAILED with seed %d: TROUPE_NEMESIS_SEED=%d replays the schedule", seed, seed)
		}
	}()
	for end := time.Now().Add(run); time.Now().Before(end) && !t.Failed(); {
		z.step()
		time.Sleep(time.Duration(100+z.rng.IntN(2400)) * time.Millisecond)
		if v := z.violation(); v != "" {
			t.Fatalf("after %q: %s", z.schedule[len(z.schedule)-1], v)
		}
	}
	z.note("heal and restart everything")
	z.healAll()
	z.waitConverged(60 * time.Second)
	if v := z.violation(); v != "" {
		t.Fatal(v)
	}
	t.Logf("%d steps, %d processes started", len(z.schedule), z.started)
}

// procView is a member's last reported view.
type procView struct {
	stopped     bool
	self        string
	status      MemberStatus
	leader      string
	unreachable int
	members     map[string]MemberStatus
}

type procSlot struct {
	host    *hostnet.Host
	name    string
	node    *nsNode
	shut    bool // told to shut down: its process lives on, with its node closed
	paused  bool
	dead    bool // killed or shut down, not yet restarted
	stopped bool // its cluster stopped (downed or left)
}

type procNemesis struct {
	t        *testing.T
	seed     uint64
	rng      *rand.Rand
	net      *hostnet.Net
	slots    []*procSlot
	schedule []string
	started  int

	mu         sync.Mutex
	views      map[string]procView // by uid
	seen       map[string]map[string]bool
	off        map[string]map[string]bool // observer uid -> uids it wrote off
	gone       map[string]bool            // processes that no longer run: their late lines are ignored
	stoppedNow map[string]bool            // SIGSTOPped now: their last view is stale
	bad        string
}

const procHB = 100 * time.Millisecond

func (s *procSlot) start(z *procNemesis, seed string) {
	z.t.Helper()
	z.started++
	if old := s.node; old != nil {
		// The address is free once the old node has closed: a killed
		// process has exited, a shut down one has said so.
		if s.shut {
			deadline := time.After(20 * time.Second)
			for done := false; !done; {
				select {
				case l := <-old.lines:
					done = l == "SHUTDOWN"
				case <-old.ended:
					done = true
				case <-deadline:
					z.t.Fatalf("%s did not finish its shutdown within 20 s", s.name)
				}
			}
		} else {
			select {
			case <-old.ended:
			case <-time.After(10 * time.Second):
			}
		}
	}
	s.shut = false
	s.node = startNSViews(z.t, s.host, s.name, 7000, procHB, 10*time.Second, z.take, "TROUPE_NETNS_LOG=1")
	s.dead, s.paused, s.stopped = false, false, false
	go func(nn *nsNode) { // CLUSTERSTOPPED and the like, until its output ends
		for {
			select {
			case <-nn.events:
			case <-nn.ended:
				return
			}
		}
	}(s.node)
	s.node.must("cluster majority " + seed)
	s.node.must("views")
}

func (z *procNemesis) note(s string) {
	z.schedule = append(z.schedule, fmt.Sprintf("%4d %s", len(z.schedule), s))
}

// take records a VIEW line and checks the invariant.
func (z *procNemesis) take(line string) {
	f := strings.Fields(line)
	if len(f) < 6 {
		return
	}
	st, _ := strconv.Atoi(f[3])
	unr, _ := strconv.Atoi(f[5])
	v := procView{stopped: f[1] == "1", self: f[2], status: MemberStatus(st), leader: f[4], unreachable: unr, members: map[string]MemberStatus{}}
	if len(f) > 6 {
		for _, kv := range strings.Split(f[6], ",") {
			uid, s, _ := strings.Cut(kv, "=")
			n, _ := strconv.Atoi(s)
			v.members[uid] = MemberStatus(n)
		}
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.gone[v.self] {
		return
	}
	z.views[v.self] = v
	if v.stopped || v.status != MemberUp {
		return
	}
	seen, off := z.seen[v.self], z.off[v.self]
	if seen == nil {
		seen, off = map[string]bool{}, map[string]bool{}
		z.seen[v.self], z.off[v.self] = seen, off
	}
	for uid, st := range v.members {
		seen[uid] = true
		if st >= MemberDown {
			off[uid] = true
		}
	}
	for uid := range seen {
		if _, ok := v.members[uid]; !ok {
			off[uid] = true
		}
	}
	if z.bad != "" {
		return
	}
	for other, ov := range z.views {
		if other == v.self || ov.stopped || ov.status != MemberUp || z.stoppedNow[other] {
			continue
		}
		if off[other] && z.off[other][v.self] {
			z.bad = fmt.Sprintf("%s and %s are both up and running, and each has written the other off", v.self[:8], other[:8])
		}
	}
}

func (z *procNemesis) violation() string {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.bad
}

// forget drops a process's view: it no longer runs.
func (z *procNemesis) forget(s *procSlot) {
	z.mu.Lock()
	defer z.mu.Unlock()
	delete(z.views, s.node.uid)
	z.gone[s.node.uid] = true
}

// setPaused records that s is SIGSTOPped (its view is stale) or not.
func (z *procNemesis) setPaused(s *procSlot, paused bool) {
	z.mu.Lock()
	defer z.mu.Unlock()
	s.paused = paused
	z.stoppedNow[s.node.uid] = paused
}

func (z *procNemesis) live() []*procSlot {
	var out []*procSlot
	for _, s := range z.slots {
		if !s.dead && !s.paused {
			out = append(out, s)
		}
	}
	return out
}

func slotNames(ss []*procSlot) string {
	var n []string
	for _, s := range ss {
		n = append(n, s.name)
	}
	return strings.Join(n, ",")
}

func (z *procNemesis) step() {
	live := z.live()
	z.rng.Shuffle(len(live), func(i, j int) { live[i], live[j] = live[j], live[i] })
	switch r := z.rng.IntN(100); {
	case r < 15:
		z.note("heal, restart the dead")
		z.healAll()
	case r < 30 && len(live) >= 2: // a clean split
		k := 1 + z.rng.IntN(len(live)-1)
		a, b := live[:k], live[k:]
		z.note(fmt.Sprintf("partition %s | %s", slotNames(a), slotNames(b)))
		for _, x := range a {
			for _, y := range b {
				x.host.DropFrom(y.host)
				y.host.DropFrom(x.host)
			}
		}
	case r < 40 && len(live) >= 2:
		z.note(fmt.Sprintf("cut %s - %s", live[0].name, live[1].name))
		live[0].host.DropFrom(live[1].host)
		live[1].host.DropFrom(live[0].host)
	case r < 48 && len(live) >= 2:
		z.note(fmt.Sprintf("drop %s -> %s", live[1].name, live[0].name))
		live[0].host.DropFrom(live[1].host)
	case r < 62 && len(live) >= 1: // SIGSTOP, shorter or longer than the windows
		d := time.Duration(100+z.rng.IntN(400)) * time.Millisecond
		if z.rng.IntN(2) == 0 {
			d = time.Duration(1500+z.rng.IntN(3000)) * time.Millisecond
		}
		s := live[0]
		z.note(fmt.Sprintf("SIGSTOP %s for %v", s.name, d))
		z.setPaused(s, true)
		s.node.cmd.Process.Signal(syscall.SIGSTOP)
		time.Sleep(d)
		s.node.cmd.Process.Signal(syscall.SIGCONT)
		z.setPaused(s, false)
	case r < 70 && len(live) >= 2: // reset every connection of one host
		z.note("ss -K on " + live[0].name)
		live[0].host.Command("ss", "-K", "state", "established").Run()
	case r < 80 && len(live) >= 1: // kill -9
		s := live[0]
		z.note("kill -9 " + s.name)
		s.node.cmd.Process.Kill()
		s.dead = true
		z.forget(s)
	case r < 88 && len(live) >= 1: // a graceful stop
		s := live[0]
		z.note("shutdown " + s.name)
		fmt.Fprintln(s.node.stdin, "shutdown")
		s.dead, s.shut = true, true
		z.forget(s)
	default: // restart one dead member at its address
		for _, s := range z.slots {
			if s.dead {
				z.note("restart " + s.name + " at its address")
				z.restart(s)
				break
			}
		}
	}
}

// restart starts a new process on a dead slot's host and port, joining
// through a running member (or starting anew when none runs).
func (z *procNemesis) restart(s *procSlot) {
	seed := "-"
	for _, o := range z.slots {
		if o != s && !o.dead && !z.clusterStopped(o) {
			seed = o.node.addr
			break
		}
	}
	s.start(z, seed)
}

func (z *procNemesis) clusterStopped(s *procSlot) bool {
	z.mu.Lock()
	defer z.mu.Unlock()
	v, ok := z.views[s.node.uid]
	return ok && v.stopped
}

// healAll lifts every rule and restarts what is dead or downed.
func (z *procNemesis) healAll() {
	for _, s := range z.slots {
		s.host.Clear()
	}
	for _, s := range z.slots {
		if !s.dead && z.clusterStopped(s) {
			fmt.Fprintln(s.node.stdin, "shutdown") // downed: its node goes, as CloseNodeOnDown would
			s.dead, s.shut = true, true
			z.forget(s)
		}
	}
	for _, s := range z.slots {
		if s.dead {
			z.restart(s)
		}
	}
}

// waitConverged waits until every running member reports every running
// member up, nobody unreachable, and one leader.
func (z *procNemesis) waitConverged(within time.Duration) {
	z.t.Helper()
	deadline := time.Now().Add(within)
	noneUpSince := time.Time{}
	for {
		// A cluster whose up members have all gone is dead (see the
		// in-process nemesis): start it afresh, as an orchestrator would.
		z.mu.Lock()
		anyUp := false
		for _, s := range z.slots {
			if v, ok := z.views[s.node.uid]; ok && !s.dead && !v.stopped && v.status == MemberUp {
				anyUp = true
			}
		}
		z.mu.Unlock()
		switch {
		case anyUp:
			noneUpSince = time.Time{}
		case noneUpSince.IsZero():
			noneUpSince = time.Now()
		case time.Since(noneUpSince) > 3*time.Second:
			z.note("no member is up: the cluster is dead; start it afresh")
			for _, s := range z.slots {
				if !s.dead {
					s.node.cmd.Process.Kill()
					s.dead = true
					z.forget(s)
				}
			}
			z.slots[0].start(z, "-")
			for _, s := range z.slots[1:] {
				s.start(z, z.slots[0].node.addr)
			}
			noneUpSince = time.Time{}
			continue
		}
		z.mu.Lock()
		ok, leader, n := true, "", 0
		for _, s := range z.slots {
			if s.dead {
				continue
			}
			n++
			v, has := z.views[s.node.uid]
			up := 0
			for _, st := range v.members {
				if st == MemberUp {
					up++
				} else if st < MemberDown {
					ok = false
				}
			}
			if !has || v.stopped || v.unreachable > 0 || (leader != "" && v.leader != leader) || v.leader == "-" {
				ok = false
			}
			leader = v.leader
			if up != len(z.live()) {
				ok = false
			}
		}
		bad := z.bad
		z.mu.Unlock()
		if bad != "" {
			z.t.Fatal(bad)
		}
		if ok && n > 0 {
			return
		}
		if time.Now().After(deadline) {
			z.mu.Lock()
			for _, s := range z.slots {
				z.t.Logf("%s dead=%v view %+v", s.name, s.dead, z.views[s.node.uid])
			}
			z.mu.Unlock()
			for _, s := range z.slots {
				if s.node.logs != nil {
					z.t.Logf("%s (%s) logged last:\n%s", s.name, s.node.uid, strings.Join(s.node.logs.last(), "\n"))
				}
			}
			z.t.Fatalf("the members did not converge on one leader within %v", within)
		}
		time.Sleep(50 * time.Millisecond)
		// A member downed meanwhile is restarted, as an orchestrator would.
		for _, s := range z.slots {
			if !s.dead && z.clusterStopped(s) {
				fmt.Fprintln(s.node.stdin, "shutdown")
				s.dead, s.shut = true, true
				z.forget(s)
				z.restart(s)
			}
		}
	}
}
