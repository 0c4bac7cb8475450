package troupe_test

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"troupe"
)

// The nemesis: a seeded random schedule of faults against a cluster on the
// fault network, with the cluster's promises checked after every step and
// continuously. It thinks of the scenarios nobody wrote down.
//
//	TROUPE_NEMESIS_DURATION  how long the schedule runs (default 15 s; 2m in CI)
//	TROUPE_NEMESIS_SEED      the seed, to replay a run (default: the clock)
//
// On a violation the test prints the seed and the schedule so far;
// running it again with that seed replays the same schedule (the timing of
// the cluster's reactions is the machine's, so a replay is likely, not
// certain, to meet the same violation).

// nemesisMsg is one message of a numbered stream between two members.
type nemesisMsg struct {
	From, To string // node uids
	Seq      uint64
}

// nemesisWatch asks a member's watcher to watch another member's sink.
type nemesisWatch struct {
	Target troupe.AnyRef
	UID    string
}

func init() {
	troupe.SetWireKey[nemesisMsg]("troupe_test.nemesis.msg")
}

type nemesisMember struct {
	name   string
	node   *troupe.Node
	c      *troupe.Cluster
	lease  troupe.Lease
	sink   troupe.Ref[nemesisMsg]
	watch  troupe.Ref[nemesisWatch]
	clock  troupe.Ref[nemesisMsg]
	carts  *troupe.Sharded[nemesisMsg]
	gone   bool // stopped by the schedule (killed, shut down) or downed
	reason string
}

func (m *nemesisMember) uid() string { return m.node.UID().String() }

func (m *nemesisMember) running() bool { return !m.gone && !clusterStopped(m.c) }

// nemesisStream is what one member sent another and what arrived.
type nemesisStream struct {
	sent        uint64          // highest seq told
	delivered   []uint64        // in arrival order
	dead        map[uint64]bool // seq -> unconfirmed
	outOfOrder  string
	deliveredAt map[uint64]bool
}

type nemesis struct {
	t    *testing.T
	rng  *rand.Rand
	seed uint64
	f    *troupe.FaultNet
	log  *slog.Logger

	leaseNode *troupe.Node
	useLease  bool

	mu         sync.Mutex
	members    []*nemesisMember
	streams    map[[2]string]*nemesisStream
	terminated map[[2]string]int // (watcher uid, target uid) -> Terminated count
	watched    map[[2]string]bool
	refs       map[[2]string]troupe.Ref[nemesisMsg] // (from uid, to uid) -> to's sink on from's node
	resolving  map[[2]string]bool
	schedule   []string
	born       int
	watcher    *sidesWatcher
	violation  string
	// The singleton's instances and the sharded entities running now,
	// over every member: never two of one.
	singles  int
	entities map[string]int
}

func nemesisDuration(t *testing.T) time.Duration {
	if s := os.Getenv("TROUPE_NEMESIS_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("TROUPE_NEMESIS_DURATION=%q: %v", s, err)
		}
		return d
	}
	if testing.Short() {
		return 5 * time.Second
	}
	return 15 * time.Second
}

func TestNemesis(t *testing.T) {
	longRun(t, "TROUPE_NEMESIS_DURATION", "TROUPE_NEMESIS_SEED")
	t.Parallel() // beside the process nemesis: CI's step runs both at once
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("TROUPE_NEMESIS_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("TROUPE_NEMESIS_SEED=%q: %v", s, err)
		}
	}
	run := nemesisDuration(t)
	var logs lockedBuffer
	z := &nemesis{
		t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x7e57)), f: new(troupe.FaultNet),
		log:  slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
		refs: map[[2]string]troupe.Ref[nemesisMsg]{}, resolving: map[[2]string]bool{},
		streams: map[[2]string]*nemesisStream{}, terminated: map[[2]string]int{}, watched: map[[2]string]bool{},
		watcher: newSidesWatcher(), entities: map[string]int{},
	}
	z.useLease = z.rng.IntN(2) == 0
	t.Logf("seed %d (TROUPE_NEMESIS_SEED=%d replays it), %v, lease %v", seed, seed, run, z.useLease)
	t.Cleanup(z.f.Heal) // first: the nodes close without waiting on a cut network
	z.leaseNode = z.start("lease")
	if err := z.leaseNode.ServeLeases(); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		z.join()
	}
	z.waitConverged(30 * time.Second)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { z.send(stop) })
	wg.Go(func() { z.check(stop) })
	wg.Go(func() { z.sendPlaced(stop) })
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
		if t.Failed() {
			lines := strings.Split(logs.String(), "\n")
			t.Logf("the last warnings:\n%s", strings.Join(lines[max(0, len(lines)-60):], "\n"))
			t.Logf("the schedule:\n%s", strings.Join(z.schedule, "\n"))
			t.Logf("FAILED with seed %d: TROUPE_NEMESIS_SEED=%d replays the schedule", seed, seed)
		}
	}()

	for end := time.Now().Add(run); time.Now().Before(end) && !t.Failed(); {
		z.step()
		z.wait(time.Duration(100+z.rng.IntN(2400)) * time.Millisecond)
		if v := z.currentViolation(); v != "" {
			t.Fatalf("after %q: %s", z.schedule[len(z.schedule)-1], v)
		}
	}
	// Heal, restart what stopped, and the cluster must converge with one
	// leader; then every stream and watch is checked.
	z.note("heal and restart everything")
	z.f.Heal()
	z.restartStopped()
	z.waitConverged(60 * time.Second)
	close(stop)
	wg.Wait()
	if v := z.currentViolation(); v != "" {
		t.Fatal(v)
	}
	z.checkStreams()
	z.checkWatches()
	t.Logf("%d steps, %d members over the run", len(z.schedule), z.born)
}

func (z *nemesis) start(name string) *troupe.Node {
	n, err := z.f.Start(context.Background(), troupe.Config{Name: name, Logger: z.log.With("node", name),
		HeartbeatInterval: 50 * time.Millisecond, UnreachableAfter: 2 * time.Second})
	if err != nil {
		z.t.Fatal(err)
	}
	z.t.Cleanup(func() { n.Close() })
	return n
}

func (z *nemesis) note(s string) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.schedule = append(z.schedule, fmt.Sprintf("%4d %s", len(z.schedule), s))
}

// wait sleeps d: the schedule's own pace between faults.
func (z *nemesis) wait(d time.Duration) { time.Sleep(d) }

// join starts a new member that joins through the running ones.
func (z *nemesis) join() *nemesisMember {
	z.mu.Lock()
	z.born++
	name := fmt.Sprintf("m%d", z.born)
	var seeds []string
	for _, m := range z.members {
		if m.running() {
			seeds = append(seeds, m.node.Addrs()[0].String())
		}
	}
	z.mu.Unlock()
	n := z.start(name)
	m := &nemesisMember{name: name, node: n}
	cfg := troupe.ClusterConfig{
		Seeds: seeds, StableAfter: time.Second, DownAllWhenUnstable: 1500 * time.Millisecond,
		LeaseMinorityDelay: 300 * time.Millisecond, CloseNodeOnDown: true,
		Downing: troupe.KeepMajority(),
		Detector: func() troupe.FailureDetector {
			d := &troupe.PhiAccrual{}
			d.FirstHeartbeatEstimate = 50 * time.Millisecond
			d.AcceptableHeartbeatPause = 300 * time.Millisecond
			d.MinStdDeviation = 10 * time.Millisecond
			return d
		},
	}
	if z.useLease {
		m.lease = troupe.NewNodeLease(n, z.leaseNode.Addrs()[0].String(), "cluster", 2*time.Second)
		cfg.Downing, cfg.Lease = troupe.LeaseMajority(), m.lease
	}
	uid := n.UID().String()
	sink, err := troupe.Spawn(n, "sink", troupe.Behavior[nemesisMsg]{Receive: func(_ *troupe.Context[nemesisMsg], msg nemesisMsg) {
		z.delivered(msg, uid)
	}})
	if err != nil {
		z.t.Fatal(err)
	}
	m.sink = sink
	refs := map[string]string{} // watched ref -> target uid (the watcher's own)
	m.watch, err = troupe.Spawn(n, "watcher", troupe.Behavior[nemesisWatch]{
		Receive: func(c *troupe.Context[nemesisWatch], w nemesisWatch) {
			refs[w.Target.String()] = w.UID
			c.Watch(w.Target)
		},
		Signal: func(_ *troupe.Context[nemesisWatch], s troupe.Signal) {
			if term, ok := s.(troupe.Terminated); ok {
				z.mu.Lock()
				z.terminated[[2]string{uid, refs[term.Ref.String()]}]++
				z.mu.Unlock()
			}
		},
	})
	if err != nil {
		z.t.Fatal(err)
	}
	troupe.Subscribe(n, func(d troupe.DeadLetter) {
		if msg, ok := d.Message.(nemesisMsg); ok {
			z.deadLetter(msg, d.Unconfirmed)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m.c, err = troupe.StartCluster(ctx, n, cfg)
	if err != nil {
		z.note(fmt.Sprintf("%s could not join: %v", name, err))
		m.c = nil
		n.Close()
		return nil
	}
	z.watcher.add(m.c)
	z.place(m)
	z.mu.Lock()
	z.members = append(z.members, m)
	z.mu.Unlock()
	return m
}

// place makes m run the singleton "clock" and the kind "carts", whose
// instances and entities count themselves running in z: a second one of
// either is a violation.
func (z *nemesis) place(m *nemesisMember) {
	count := func(key string, d int) {
		z.mu.Lock()
		defer z.mu.Unlock()
		n := &z.singles
		if key != "" {
			v := z.entities[key] + d
			z.entities[key] = v
			n = &v
		} else {
			z.singles += d
		}
		if *n > 1 && z.violation == "" {
			z.violation = fmt.Sprintf("two instances of %q run at once", cmp.Or(key, "the singleton"))
		}
	}
	behavior := func(key string) troupe.Behavior[nemesisMsg] {
		return troupe.Behavior[nemesisMsg]{
			Setup:   func(*troupe.Context[nemesisMsg]) { count(key, 1) },
			Receive: func(*troupe.Context[nemesisMsg], nemesisMsg) {},
			Signal: func(_ *troupe.Context[nemesisMsg], s troupe.Signal) {
				if _, ok := s.(troupe.PostStop); ok {
					count(key, -1)
				}
			},
		}
	}
	var err error
	if m.clock, err = troupe.Singleton(m.c, "clock", func() troupe.Behavior[nemesisMsg] { return behavior("") }, troupe.SingletonConfig{}); err != nil {
		z.note(fmt.Sprintf("%s: Singleton: %v", m.name, err))
	}
	if m.carts, err = troupe.Sharding(m.c, "carts", func(id string) troupe.Behavior[nemesisMsg] { return behavior("cart " + id) },
		troupe.ShardingConfig{Shards: 20, PassivateAfter: time.Second, RebalanceInterval: 500 * time.Millisecond}); err != nil {
		z.note(fmt.Sprintf("%s: Sharding: %v", m.name, err))
	}
}

// sendPlaced sends to the singleton and to carts through running members
// until stop, so that they start (and move) all along.
func (z *nemesis) sendPlaced(stop <-chan struct{}) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		for _, m := range z.runningMembers() {
			if m.carts != nil && !m.clock.IsZero() {
				m.clock.Tell(nemesisMsg{Seq: uint64(i)})
				m.carts.Entity(fmt.Sprint("c", i%12)).Tell(nemesisMsg{Seq: uint64(i)})
			}
		}
	}
}

func (z *nemesis) delivered(msg nemesisMsg, at string) {
	z.mu.Lock()
	defer z.mu.Unlock()
	s := z.stream(msg.From, msg.To)
	if msg.To != at {
		s.outOfOrder = fmt.Sprintf("message %d for %s delivered at %s", msg.Seq, msg.To, at)
	}
	if s.deliveredAt[msg.Seq] {
		s.outOfOrder = fmt.Sprintf("message %d delivered twice", msg.Seq)
	}
	if n := len(s.delivered); n > 0 && msg.Seq <= s.delivered[n-1] && s.outOfOrder == "" {
		s.outOfOrder = fmt.Sprintf("message %d after %d", msg.Seq, s.delivered[n-1])
	}
	s.delivered = append(s.delivered, msg.Seq)
	s.deliveredAt[msg.Seq] = true
}

func (z *nemesis) deadLetter(msg nemesisMsg, unconfirmed bool) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.stream(msg.From, msg.To).dead[msg.Seq] = unconfirmed
	delete(z.refs, [2]string{msg.From, msg.To}) // resolve again
}

func (z *nemesis) stream(from, to string) *nemesisStream {
	k := [2]string{from, to}
	s := z.streams[k]
	if s == nil {
		s = &nemesisStream{dead: map[uint64]bool{}, deliveredAt: map[uint64]bool{}}
		z.streams[k] = s
	}
	return s
}

// send tells every running member's sink the next number of its stream
// from every other running member, every 20 ms, over a ref resolved once
// (and again after a dead letter), and has every member watch every
// other's sink once.
func (z *nemesis) send(stop <-chan struct{}) {
	var resolvers sync.WaitGroup
	defer resolvers.Wait()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	type tell struct {
		ref troupe.Ref[nemesisMsg]
		msg nemesisMsg
	}
	type watch struct {
		from *nemesisMember
		w    nemesisWatch
	}
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		var tells []tell
		var watches []watch
		z.mu.Lock()
		for _, a := range z.members {
			for _, b := range z.members {
				if a == b || !a.running() || !b.running() {
					continue
				}
				k := [2]string{a.uid(), b.uid()}
				ref, ok := z.refs[k]
				if !ok {
					if !z.resolving[k] {
						z.resolving[k] = true
						resolvers.Go(func() { z.resolve(a, b, stop) })
					}
					continue
				}
				s := z.stream(a.uid(), b.uid())
				s.sent++
				tells = append(tells, tell{ref, nemesisMsg{From: k[0], To: k[1], Seq: s.sent}})
				if !z.watched[k] {
					z.watched[k] = true
					watches = append(watches, watch{a, nemesisWatch{Target: ref, UID: k[1]}})
				}
			}
		}
		z.mu.Unlock()
		for _, w := range watches {
			w.from.watch.Tell(w.w)
		}
		for _, tl := range tells {
			tl.ref.Tell(tl.msg)
		}
	}
}

// resolve finds b's sink from a's node.
func (z *nemesis) resolve(a, b *nemesisMember, stop <-chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	ref, err := troupe.Resolve[nemesisMsg](ctx, a.node, troupe.FormatRef(b.node.Addrs()[0], "/user/sink"))
	z.mu.Lock()
	defer z.mu.Unlock()
	k := [2]string{a.uid(), b.uid()}
	delete(z.resolving, k)
	if err == nil {
		z.refs[k] = ref
	}
}

// check samples the split-brain and lease invariants every 5 ms.
func (z *nemesis) check(stop <-chan struct{}) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		v := z.watcher.check()
		if v == "" && z.useLease {
			var holders []string
			z.mu.Lock()
			for _, m := range z.members {
				// Any member whose node still runs, stopped by the
				// schedule or not: a leaving holder may hold it still.
				if m.node.Alive() == nil && m.lease.CheckHeld(m.uid()) {
					holders = append(holders, m.name)
				}
			}
			z.mu.Unlock()
			if len(holders) > 1 {
				v = fmt.Sprintf("two lease holders at once: %v", holders)
			}
		}
		if v != "" {
			z.mu.Lock()
			if z.violation == "" {
				z.violation = v
			}
			z.mu.Unlock()
		}
	}
}

func (z *nemesis) currentViolation() string {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.violation
}

// pick returns k distinct running members, or nil when there are fewer.
func (z *nemesis) pick(k int) []*nemesisMember {
	z.mu.Lock()
	defer z.mu.Unlock()
	var live []*nemesisMember
	for _, m := range z.members {
		if m.running() {
			live = append(live, m)
		}
	}
	if len(live) < k {
		return nil
	}
	z.rng.Shuffle(len(live), func(i, j int) { live[i], live[j] = live[j], live[i] })
	return live[:k]
}

func names(ms []*nemesisMember) string {
	var s []string
	for _, m := range ms {
		s = append(s, m.name)
	}
	return strings.Join(s, ",")
}

// step applies one random fault.
func (z *nemesis) step() {
	switch r := z.rng.IntN(100); {
	case r < 15:
		z.note("heal, restart the stopped")
		z.f.Heal()
		z.restartStopped()
	case r < 30: // a clean split
		all := z.pick(len(z.runningMembers()))
		if len(all) < 2 {
			return
		}
		k := 1 + z.rng.IntN(len(all)-1)
		a, b := all[:k], all[k:]
		z.note(fmt.Sprintf("partition %s | %s", names(a), names(b)))
		for _, x := range a {
			for _, y := range b {
				z.f.Partition(x.node, y.node)
			}
		}
	case r < 40: // a partial partition: one pair
		if p := z.pick(2); p != nil {
			z.note(fmt.Sprintf("cut %s - %s", p[0].name, p[1].name))
			z.f.Partition(p[0].node, p[1].node)
		}
	case r < 44: // one way, a member or a minority group against the rest, either way
		all := z.pick(len(z.runningMembers()))
		if len(all) < 2 {
			return
		}
		k := 1 + z.rng.IntN(max(1, (len(all)-1)/2)) // at most a minority
		g, rest := all[:k], all[k:]
		from, to, how := g, rest, "cannot send"
		if z.rng.IntN(2) == 0 {
			from, to, how = rest, g, "cannot receive"
		}
		z.note(fmt.Sprintf("one way: %s %s (drop %s -> %s)", names(g), how, names(from), names(to)))
		for _, x := range from {
			for _, y := range to {
				z.f.Drop(x.node, y.node)
			}
		}
	case r < 48: // one way, one pair
		if p := z.pick(2); p != nil {
			z.note(fmt.Sprintf("drop %s -> %s", p[0].name, p[1].name))
			z.f.Drop(p[0].node, p[1].node)
		}
	case r < 58: // a pause, shorter or longer than the windows
		if p := z.pick(1); p != nil {
			d := time.Duration(100+z.rng.IntN(400)) * time.Millisecond
			if z.rng.IntN(2) == 0 {
				d = time.Duration(1500+z.rng.IntN(3000)) * time.Millisecond
			}
			z.note(fmt.Sprintf("pause %s for %v", p[0].name, d))
			z.f.Pause(p[0].node)
			z.wait(d)
			z.f.Resume(p[0].node)
		}
	case r < 68: // connection resets
		if p := z.pick(2); p != nil {
			z.note(fmt.Sprintf("reset %s - %s", p[0].name, p[1].name))
			z.f.Reset(p[0].node, p[1].node)
		}
	case r < 76: // kill -9
		if p := z.pick(1); p != nil {
			z.note("kill " + p[0].name)
			z.stopMember(p[0], "killed", func() { z.f.Kill(p[0].node) })
		}
	case r < 84: // the lease server cut off from some members
		all := z.runningMembers()
		if len(all) == 0 {
			return
		}
		p := z.pick(1 + z.rng.IntN(len(all)))
		z.note("cut the lease from " + names(p))
		for _, m := range p {
			z.f.Partition(m.node, z.leaseNode)
		}
	case r < 92: // a graceful stop
		if p := z.pick(1); p != nil {
			z.note("shut down " + p[0].name)
			z.stopMember(p[0], "shut down", func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				p[0].node.Shutdown(ctx)
			})
		}
	default: // a new member joins
		if len(z.runningMembers()) < 7 {
			m := z.join()
			if m != nil {
				z.note("join " + m.name + " (" + m.uid()[:8] + ")")
			}
		}
	}
}

func (z *nemesis) runningMembers() []*nemesisMember {
	z.mu.Lock()
	defer z.mu.Unlock()
	var live []*nemesisMember
	for _, m := range z.members {
		if m.running() {
			live = append(live, m)
		}
	}
	return live
}

func (z *nemesis) stopMember(m *nemesisMember, why string, stop func()) {
	z.mu.Lock()
	m.gone, m.reason = true, why
	z.mu.Unlock()
	stop()
}

// restartStopped starts a new member for each one that stopped (the way
// an orchestrator restarts a process), keeping five running.
func (z *nemesis) restartStopped() {
	for len(z.runningMembers()) < 5 {
		if z.join() == nil {
			return
		}
	}
}

// waitConverged waits until every running member sees every running
// member up, nobody unreachable, and the same leader.
func (z *nemesis) waitConverged(within time.Duration) {
	z.t.Helper()
	deadline := time.Now().Add(within)
	noneUpSince := time.Time{}
	for {
		live := z.runningMembers()
		// A cluster whose up members have all gone is dead: joiners wait
		// for a leader that will never come back (none may declare itself
		// up: its side could be a partition of a live cluster). An
		// orchestrator then starts the cluster afresh, and so does this.
		anyUp := false
		for _, m := range live {
			anyUp = anyUp || m.c.Self().Status == troupe.MemberUp
		}
		switch {
		case anyUp:
			noneUpSince = time.Time{}
		case noneUpSince.IsZero():
			noneUpSince = time.Now()
		case time.Since(noneUpSince) > 3*time.Second:
			z.note("no member is up: the cluster is dead; start it afresh")
			for _, m := range live {
				z.stopMember(m, "shut down", func() { m.node.Close() })
			}
			noneUpSince = time.Time{}
			z.restartStopped()
			continue
		}
		ok := len(live) > 0
		var leader troupe.NodeUID
		for i, m := range live {
			l, has := m.c.Leader()
			if !has || i > 0 && l.UID != leader || len(m.c.Unreachable()) > 0 {
				ok = false
				break
			}
			leader = l.UID
			up := 0
			for _, x := range m.c.Members() {
				if x.Status == troupe.MemberUp {
					up++
				} else if x.Status < troupe.MemberDown {
					ok = false
				}
			}
			if up != len(live) {
				ok = false
			}
		}
		if ok {
			return
		}
		if v := z.currentViolation(); v != "" {
			z.t.Fatal(v)
		}
		if time.Now().After(deadline) {
			for _, m := range live {
				l, _ := m.c.Leader()
				z.t.Logf("%s leader %v members %v unreachable %v", m.name, l, m.c.Members(), m.c.Unreachable())
			}
			z.t.Fatalf("the cluster did not converge with one leader within %v of healing", within)
		}
		time.Sleep(20 * time.Millisecond)
		z.restartStopped()
	}
}

// checkStreams: every stream arrived in order without duplicates, and
// every message sent was delivered or became a dead letter; one both
// delivered and a dead letter must be an unconfirmed one (written, its
// receipt never confirmed).
func (z *nemesis) checkStreams() {
	// Let what is in flight land: until no stream changes for 500 ms.
	last := ""
	for i := 0; i < 40; i++ {
		time.Sleep(250 * time.Millisecond)
		z.mu.Lock()
		sum := 0
		for _, s := range z.streams {
			sum += len(s.delivered) + len(s.dead)
		}
		z.mu.Unlock()
		cur := strconv.Itoa(sum)
		if cur == last {
			break
		}
		last = cur
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	var total, lostTotal uint64
	for k, s := range z.streams {
		if s.outOfOrder != "" {
			z.t.Errorf("stream %s -> %s: %s", k[0][:8], k[1][:8], s.outOfOrder)
		}
		var missing []uint64
		for seq := uint64(1); seq <= s.sent; seq++ {
			unconfirmed, dead := s.dead[seq]
			switch {
			case !s.deliveredAt[seq] && !dead:
				missing = append(missing, seq)
			case s.deliveredAt[seq] && dead && !unconfirmed:
				z.t.Errorf("stream %s -> %s: message %d delivered and a confirmed dead letter", k[0][:8], k[1][:8], seq)
			}
		}
		if len(missing) > 0 {
			z.t.Errorf("stream %s -> %s: %d of %d messages neither delivered nor dead letters (first %d)", k[0][:8], k[1][:8], len(missing), s.sent, missing[0])
		}
		total += s.sent
		lostTotal += uint64(len(s.dead))
	}
	z.t.Logf("%d streams, %d messages, %d dead letters", len(z.streams), total, lostTotal)
}

// checkWatches: no watch got two Terminated; every running member's watch
// of a member that has stopped got exactly one.
func (z *nemesis) checkWatches() {
	z.mu.Lock()
	defer z.mu.Unlock()
	byUID := map[string]*nemesisMember{}
	for _, m := range z.members {
		byUID[m.uid()] = m
	}
	for k, n := range z.terminated {
		if n > 1 {
			z.t.Errorf("%s's watch of %s got %d Terminated", byUID[k[0]].name, byUID[k[1]].name, n)
		}
	}
	for k := range z.watched {
		w, target := byUID[k[0]], byUID[k[1]]
		if w.running() && !target.running() && z.terminated[k] != 1 {
			z.t.Errorf("%s's watch of %s (%s) got %d Terminated, want 1", w.name, target.name, target.reason, z.terminated[k])
		}
	}
	if slices.ContainsFunc(z.members, func(m *nemesisMember) bool { return m.c == nil }) {
		z.t.Error("a member without a cluster is listed")
	}
}
