package troupe

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"reflect"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// What one connected peer can make this node hold or do is bounded per
// peer (issue #34): the watches it places, and the dials the refs it sends
// cause.

// watchFrames returns n watch frames of the actor at path, from watchers
// whose paths are prefix followed by a number.
func watchFrames(path string, uuid UUID, prefix string, from, n int) []byte {
	var b []byte
	for i := from; i < from+n; i++ {
		b = appendWhole(b, appendWatch(nil, frameWatch, watchBody{path: path, uuid: uuid, watcher: fmt.Sprintf("%s%d", prefix, i)}))
	}
	return b
}

// refusedWatches reads c until it has seen want terminated frames with the
// watch-refused reason, and fails on any other termination.
func refusedWatches(t *testing.T, c net.Conn, want int) {
	t.Helper()
	fr := newFrameReader(c, defaultMaxFrameSize)
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	for got := 0; got < want; {
		body, err := fr.next()
		if err != nil {
			t.Fatalf("after %d of %d refusals: %v", got, want, err)
		}
		if frameKind(body[0]) != frameTerminated {
			continue
		}
		w, err := parseWatch(frameTerminated, body[1:])
		if err != nil {
			t.Fatal(err)
		}
		if w.code != reasonWatchRefused {
			t.Fatalf("a watch of a live actor was answered with termination code %d (%q)", w.code, w.text)
		}
		got++
	}
}

func TestWatchesOfOnePeerAreBounded(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	slowTest(t)
	// The default window: under the race detector, on a loaded machine,
	// taking in 65,536 watches outlasted the tests' 2 s, and the peer,
	// which reads nothing meanwhile, was given up on (EOF before any
	// refusal).
	cfg := testConfig("tcp://127.0.0.1:0")
	cfg.UnreachableAfter = 10 * time.Second
	n := startNode(t, cfg)
	target := spawnEcho(t, n, "watched")
	key := target.h.key
	held := func() (count, bytes int) {
		n.peers.mu.Lock()
		all := make([]*assoc, 0, len(n.peers.all))
		for a := range n.peers.all {
			all = append(all, a)
		}
		n.peers.mu.Unlock()
		for _, a := range all {
			a.mu.Lock()
			count, bytes = max(count, len(a.reqs.watchedBy.m)), max(bytes, a.reqs.watchedBy.bytes)
			a.mu.Unlock()
		}
		return
	}

	t.Run("count", func(t *testing.T) {
		c, _ := rawPeer(t, n, false)
		limit := n.cfg.MaxWatchesPerPeer
		if limit != 65536 {
			t.Fatalf("MaxWatchesPerPeer defaults to %d", limit)
		}
		// The same watch twice is one watch.
		c.Write(watchFrames(key.path, key.uuid, "/user/w", 0, 1))
		c.Write(watchFrames(key.path, key.uuid, "/user/w", 0, limit))
		c.Write(watchFrames(key.path, key.uuid, "/user/w", limit, 10))
		refusedWatches(t, c, 10)
		if count, _ := held(); count != limit {
			t.Fatalf("the node holds %d watches of the peer, want %d", count, limit)
		}
	})

	t.Run("path bytes", func(t *testing.T) {
		c, _ := rawPeer(t, n, false)
		long := "/user/" + strings.Repeat("w", maxWatchPath-16)
		fit := maxWatchBytes / (len(long) + 5)
		c.Write(watchFrames(key.path, key.uuid, long, 10000, fit+3))
		refusedWatches(t, c, 3)
		if _, bytes := held(); bytes > maxWatchBytes {
			t.Fatalf("the node holds %d bytes of the peer's watcher paths, more than %d", bytes, maxWatchBytes)
		}
	})

	t.Run("path length", func(t *testing.T) {
		errs := make(chan ProtocolError, 1)
		SubscribeChan(n, errs)
		c, _ := rawPeer(t, n, false)
		c.Write(watchFrames(key.path, key.uuid, "/user/"+strings.Repeat("w", 1<<20), 0, 1))
		expectClosed(t, c)
		recv(t, errs, "a protocol error for a 1 MiB watcher path")
	})

	// Another node's watches are untouched by all this, and an actor
	// whose path cannot cross is told so at once.
	other := startNode(t, testConfig("tcp://127.0.0.1:0"))
	remote, err := Resolve[testPing](ctxT(t, 5*time.Second), other, FormatRef(n.Addrs()[0], "/user/watched"))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 2)
	near, _ := watcherOf(remote, got)
	if _, err := Spawn(other, "near", near); err != nil {
		t.Fatal(err)
	}
	// A watcher five levels deep under 250-byte names: a path over 1 KiB.
	var nest func(depth int) Behavior[testPing]
	nest = func(depth int) Behavior[testPing] {
		if depth == 5 {
			b, _ := watcherOf(remote, got)
			return b
		}
		return Behavior[testPing]{
			Setup: func(c *Context[testPing]) {
				if _, err := Spawn(c, fmt.Sprintf("%s%d", strings.Repeat("d", 250), depth), nest(depth+1)); err != nil {
					got <- err
				}
			},
			Receive: func(*Context[testPing], testPing) {},
		}
	}
	if _, err := Spawn(other, "deep", nest(0)); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, got, "the deep watcher's refusal"); !errors.Is(err, ErrWatchRefused) {
		t.Fatalf("a watcher with a path over 1 KiB got %v, want ErrWatchRefused", err)
	}
	n.Close()
	if err := recv(t, got, "the near watcher's termination"); errors.Is(err, ErrWatchRefused) {
		t.Fatalf("the near watcher got %v", err)
	}
}

// watcherOf is an actor that watches r and reports the reason of the
// Terminated it gets.
func watcherOf(r AnyRef, got chan<- error) (Behavior[testPing], error) {
	return Behavior[testPing]{
		Setup:   func(c *Context[testPing]) { c.Watch(r) },
		Receive: func(*Context[testPing], testPing) {},
		Signal: func(c *Context[testPing], s Signal) {
			if t, ok := s.(Terminated); ok {
				got <- t.Reason
			}
		},
	}, nil
}

type refList struct{ Refs []Ref[testPing] }

func init() { SetWireKey[refList]("troupe.test.reflist") }

// holdingListeners starts k listeners that accept connections and never
// answer: a dial to one succeeds and its handshake waits.
func holdingListeners(t *testing.T, k int) []Addr {
	t.Helper()
	var addrs []Addr
	done := make(chan struct{})
	for range k {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		addrs = append(addrs, tcpAddr(l.Addr().String()))
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() { <-done; c.Close() }() // held until the test ends
			}
		}()
	}
	t.Cleanup(func() { close(done) })
	return addrs
}

func TestRefsFromOnePeerCauseBoundedDials(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, testConfig("tcp://127.0.0.1:0"))
	limit := n.cfg.MaxRefDialsPerPeer
	if limit != 256 {
		t.Fatalf("MaxRefDialsPerPeer defaults to %d", limit)
	}
	dead := make(chan DeadLetter, 1024)
	SubscribeChan(n, dead)
	// An actor that answers every ref it is sent, as an echo does.
	told := make(chan struct{})
	if _, err := Spawn(n, "fan", Behavior[refList]{Receive: func(_ *Context[refList], m refList) {
		for _, r := range m.Refs {
			r.Tell(testPing{})
		}
		close(told)
	}}); err != nil {
		t.Fatal(err)
	}
	peer := startNode(t, testConfig("tcp://127.0.0.1:0"))
	fan, err := Resolve[refList](ctxT(t, 5*time.Second), peer, FormatRef(n.Addrs()[0], "/user/fan"))
	if err != nil {
		t.Fatal(err)
	}
	var m refList
	for _, ad := range holdingListeners(t, limit+44) {
		a, err := peer.peers.assocAt(ad, false, NodeUID{})
		if err != nil {
			t.Fatal(err)
		}
		var key refKey
		rand.Read(key.node[:])
		rand.Read(key.uuid[:])
		key.path = "/user/x"
		m.Refs = append(m.Refs, Ref[testPing]{h: &handle{node: peer, key: key, assoc: a}})
	}
	fan.Tell(m)
	recv(t, told, "the fan actor's sends")
	outbound := func() int {
		n.peers.mu.Lock()
		defer n.peers.mu.Unlock()
		return n.peers.outbound
	}
	refused := 0
	deadline := time.After(10 * time.Second)
	for refused < 44 {
		if o := outbound(); o > limit {
			t.Fatalf("the refs of one peer made the node dial %d connections at once, more than %d", o, limit)
		}
		select {
		case d := <-dead:
			if !errors.Is(d.Reason, ErrTooManyConns) || !strings.Contains(d.Reason.Error(), "MaxRefDialsPerPeer") {
				t.Fatalf("dead letter: %v", d.Reason)
			}
			refused++
		case <-deadline:
			t.Fatalf("%d of 44 sends past the bound were dead letters (ErrTooManyConns); %d dials", refused, outbound())
		}
	}
	// The node's own dials are not the peer's to spend.
	healthy := startNode(t, testConfig("tcp://127.0.0.1:0"))
	spawnEcho(t, healthy, "echo")
	if _, err := Resolve[testPing](ctxT(t, 5*time.Second), n, FormatRef(healthy.Addrs()[0], "/user/echo")); err != nil {
		t.Fatalf("Resolve while the peer's refs hold their dials: %v", err)
	}
}

// The whole attack of a peer that asks and never reads, under the default
// Config: resolves, watches of missing actors and tells whose replies go
// back to it, 30,000 frames a second, from a peer that heartbeats but
// reads nothing. The node ends the session within UnreachableAfter of its
// writer stalling, holding no more than its budgets meanwhile (issue #34,
// item 3).
func TestAPeerThatAsksAndNeverReads(t *testing.T) {
	// Not beside other tests: it bounds the growth of the process's heap,
	// which tests running beside it would add to.
	checkLeaks(t)
	cfg := Config{Listen: []string{"tcp://127.0.0.1:0"}}
	n := startNode(t, cfg)
	spawnEcho(t, n, "echo")
	ended := make(chan PeerUnreachable, 1)
	SubscribeChan(n, ended)
	protocol := make(chan ProtocolError, 1)
	SubscribeChan(n, protocol)
	c, _ := rawPeer(t, n, false)
	c.(*net.TCPConn).SetReadBuffer(4 << 10)

	// A ping whose reply goes to the peer's /user/sink, built by hand.
	ping := binary.AppendVarint(nil, 7)
	ping = append(ping, refSender)
	ping = appendString(ping, "/user/sink")
	if v, err := decodePayload(typeOf(reflect.TypeFor[testPing]()), ping); err != nil || v.(testPing).ReplyTo.h.key.path != "/user/sink" {
		t.Fatalf("the hand-built ping decodes as %+v, %v", v, err)
	}
	tell := []byte{byte(frameTell), 1}
	tell = appendString(tell, "/user/echo")
	tell = append(tell, make([]byte, 16)...)
	tell = append(tell, 1)
	tell = appendString(tell, "troupe.test.ping")
	tell = append(tell, ping...)
	var batch []byte
	long := strings.Repeat("x", 900)
	for i := range 100 {
		batch = appendWhole(batch, appendResolve(nil, resolveBody{id: uint64(i + 1), path: "/user/echo", proto: "p"}))
		// Answered by a terminated frame of about 1.8 KiB: the node's
		// writer stalls within seconds even when it runs slowly.
		batch = appendWhole(batch, appendWatch(nil, frameWatch, watchBody{path: fmt.Sprintf("/user/missing%d%s", i, long), watcher: "/user/w" + long}))
		batch = appendWhole(batch, tell)
	}
	baseline := heapInUse()
	var maxHeld, maxHeap atomic.Int64
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(10 * time.Millisecond) // 300 frames a tick
		defer tick.Stop()
		for i := 0; ; i++ {
			c.SetWriteDeadline(time.Now().Add(30 * time.Second))
			if _, err := c.Write(batch); err != nil {
				return // the node closed the connection
			}
			if i%10 == 0 {
				for _, p := range n.Stats().Peers {
					maxHeld.Store(max(maxHeld.Load(), int64(p.Held)))
				}
				maxHeap.Store(max(maxHeap.Load(), int64(heapInUse())-int64(baseline)))
			}
			<-tick.C
		}
	}()
	cfg = n.cfg
	limit := cfg.UnreachableAfter + 20*time.Second // the writer stalls once the kernel's buffers fill
	select {
	case <-done:
	case <-time.After(limit):
		// (Seen once under CI load, not reproduced: what every goroutine
		// was doing is the evidence for the next time.)
		stacks := make([]byte, 8<<20)
		stacks = stacks[:runtime.Stack(stacks, true)]
		t.Logf("stats: %+v\ngoroutines:\n%s", n.Stats().Peers, stacks)
		c.Close()
		<-done
		t.Fatalf("the session with a peer that asks and never reads still ran after %v; the node held up to %d bytes for it", limit, maxHeld.Load())
	}
	took := time.Since(start)
	if held, budget := maxHeld.Load(), int64(answerBudget+cfg.SendQueueLimit+writeChunk); held > budget {
		t.Fatalf("held %d bytes for the peer, more than %d", held, budget)
	}
	// What the node held, beyond its budgets' bytes: bounded too.
	if grew, bound := maxHeap.Load(), int64(2*(answerBudget+cfg.SendQueueLimit)); grew > bound {
		t.Fatalf("the heap grew by %d bytes, more than %d", grew, bound)
	}
	select {
	case e := <-ended:
		t.Logf("ended after %v: %v; held at most %d bytes, heap grew at most %d", took, e.Reason, maxHeld.Load(), maxHeap.Load())
	case e := <-protocol:
		t.Logf("ended after %v: %v; held at most %d bytes, heap grew at most %d", took, e.Err, maxHeld.Load(), maxHeap.Load())
	case <-time.After(5 * time.Second):
		t.Fatal("neither PeerUnreachable nor ProtocolError")
	}
}

func heapInUse() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// Refs to nodes never dialed that nobody keeps are forgotten: a message
// of 4,096 refs to unknown nodes (the default bound of such bindings),
// dropped by its handler, leaves room for the refs of later messages
// (issue #26, defect 3: the bindings stayed, and every later ref to a new
// node was a dead ref).
func TestRefsNobodyKeepsAreForgotten(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, testConfig("tcp://127.0.0.1:0"))
	got := make(chan int, 2)
	if _, err := Spawn(n, "fan", Behavior[refList]{Receive: func(_ *Context[refList], m refList) {
		if len(m.Refs) == 1 {
			m.Refs[0].Tell(testPing{N: 7})
		}
		got <- len(m.Refs)
	}}); err != nil {
		t.Fatal(err)
	}
	peer := startNode(t, testConfig("tcp://127.0.0.1:0"))
	fan, err := Resolve[refList](ctxT(t, 5*time.Second), peer, FormatRef(n.Addrs()[0], "/user/fan"))
	if err != nil {
		t.Fatal(err)
	}
	bindings := func() int {
		n.peers.mu.Lock()
		defer n.peers.mu.Unlock()
		return n.peers.bindings
	}
	var m refList
	for i := range n.cfg.MaxOutboundConns {
		ad := tcpAddr(fmt.Sprintf("127.0.0.%d:%d", 2+i/60000, 1024+i%60000))
		a, err := peer.peers.assocAt(ad, false, NodeUID{})
		if err != nil {
			t.Fatal(err)
		}
		var key refKey
		rand.Read(key.node[:])
		key.path = "/user/x"
		m.Refs = append(m.Refs, Ref[testPing]{h: &handle{node: peer, key: key, assoc: a}})
	}
	fan.Tell(m)
	recv(t, got, "the message of refs")
	if b := bindings(); b != n.cfg.MaxOutboundConns {
		t.Fatalf("%d bindings after a message of %d refs", b, n.cfg.MaxOutboundConns)
	}
	waitFor(t, 10*time.Second, "the bindings nobody keeps to be forgotten", func() bool {
		runtime.GC()
		return bindings() == 0
	})
	// A later ref to a new node is bound and works.
	other := startNode(t, testConfig("tcp://127.0.0.1:0"))
	echoed := make(chan testPing, 1)
	target, err := Spawn(other, "target", Behavior[testPing]{Receive: func(_ *Context[testPing], p testPing) { echoed <- p }})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := Resolve[testPing](ctxT(t, 5*time.Second), peer, FormatRef(other.Addrs()[0], target.h.key.path))
	if err != nil {
		t.Fatal(err)
	}
	fan.Tell(refList{Refs: []Ref[testPing]{ref}})
	recv(t, got, "the message of one ref")
	if p := recv(t, echoed, "the send through the later ref"); p.N != 7 {
		t.Fatalf("got %+v", p)
	}
}

// watchesHeld sums, over every association of n, the watches its peers'
// actors hold on n's actors.
func watchesHeld(n *Node) (count int) {
	n.peers.mu.Lock()
	all := make([]*assoc, 0, len(n.peers.all))
	for a := range n.peers.all {
		all = append(all, a)
	}
	n.peers.mu.Unlock()
	for _, a := range all {
		a.mu.Lock()
		count += len(a.reqs.watchedBy.m)
		a.mu.Unlock()
	}
	return count
}

// A watch ended after its session resumed frees its place: the bound
// counts the watches a peer holds, not those it ever placed (from the
// review of #34: the place stayed taken on the retired connection's set).
func TestAWatchEndedAfterAResumeFreesItsPlace(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	f := new(FaultNet)
	cfg := failConfig("watched", 50*time.Millisecond, 5*time.Second)
	cfg.MaxWatchesPerPeer = 2
	watched := startOn(t, f, cfg)
	from := startOn(t, f, failConfig("from", 50*time.Millisecond, 5*time.Second))
	resumed := make(chan PeerResumed, 4)
	SubscribeChan(from, resumed)
	refs := make([]Ref[count], 3)
	var locals []Ref[count]
	for i := range refs {
		local, _ := spawnCollector[count](t, watched, fmt.Sprintf("a%d", i), 1)
		locals = append(locals, local)
		r, err := Resolve[count](ctxT(t, 5*time.Second), from, FormatRef(watched.Addrs()[0], local.h.key.path))
		if err != nil {
			t.Fatal(err)
		}
		refs[i] = r
	}
	w0 := watcher(t, from, "w0", refs[0])
	w1 := watcher(t, from, "w1", refs[1])
	waitFor(t, 5*time.Second, "two watches placed", func() bool { return watchesHeld(watched) == 2 })
	if f.Reset(watched, from) == 0 {
		t.Fatal("no connection to reset")
	}
	recv(t, resumed, "the resume")
	for _, r := range locals[:2] {
		if err := watched.Stop(r); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range []chan Terminated{w0, w1} {
		if term := recv(t, w, "a Terminated"); term.Reason != nil {
			t.Fatalf("Terminated %v", term.Reason)
		}
	}
	waitFor(t, 5*time.Second, "the ended watches to free their places", func() bool { return watchesHeld(watched) == 0 })
	w2 := watcher(t, from, "w2", refs[2])
	select {
	case term := <-w2:
		t.Fatalf("a watch within the bound got %v", term.Reason)
	case <-time.After(200 * time.Millisecond):
	}
}

// An Ask to a live actor is answered though its watch was refused: the
// refusal is no stop (from the review of #34).
func TestAnAskBeyondTheWatchBoundIsAnswered(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	cfg := testConfig("tcp://127.0.0.1:0")
	cfg.MaxWatchesPerPeer = 1
	served := startNode(t, cfg)
	spawnEcho(t, served, "echo")
	spawnEcho(t, served, "other")
	asker := startNode(t, testConfig("tcp://127.0.0.1:0"))
	other, err := Resolve[testPing](ctxT(t, 5*time.Second), asker, FormatRef(served.Addrs()[0], "/user/other"))
	if err != nil {
		t.Fatal(err)
	}
	watcher(t, asker, "w", other)
	waitFor(t, 5*time.Second, "the watch placed", func() bool { return watchesHeld(served) == 1 })
	echo, err := Resolve[testPing](ctxT(t, 5*time.Second), asker, FormatRef(served.Addrs()[0], "/user/echo"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		got, err := Ask(ctxT(t, 5*time.Second), echo, func(r Ref[testPong]) testPing { return testPing{N: i, ReplyTo: r} })
		if err != nil || got.N != i {
			t.Fatalf("Ask %d beyond the watch bound: %+v, %v", i, got, err)
		}
	}
}

// Watches sent over every connection a peer has open at once, with one
// uid, count against one bound (from the review of #34: each connection
// had a set of its own).
func TestWatchesOverSeveralConnectionsShareOneBound(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	cfg := testConfig("tcp://127.0.0.1:0")
	cfg.MaxWatchesPerPeer = 4
	n := startNode(t, cfg)
	target := spawnEcho(t, n, "watched")
	key := target.h.key
	var uid NodeUID
	rand.Read(uid[:])
	var conns []net.Conn
	for i := range 5 {
		addr := n.Addrs()[0]
		c, err := net.Dial(addr.Network(), addr.Address())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		h := &hello{version: protocolVersion, name: "raw", uid: uid, flags: helloResumable}
		c.Write(appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameHello, h) }))
		conns = append(conns, c)
		for j, c := range conns {
			c.Write(watchFrames(key.path, key.uuid, fmt.Sprintf("/user/w%d-%d-", i, j), 0, 4))
		}
		time.Sleep(20 * time.Millisecond) // let the node read them before the next connection
		if held := watchesHeld(n); held > 4 {
			t.Fatalf("after %d connections, the node holds %d watches of the peer, more than 4", i+1, held)
		}
	}
}

// The dials a peer's refs caused stay charged to it across a resume of
// those links (from the review of #34: the resumed session carried no
// charge, and the peer's refs could dial again).
func TestARefDialStaysChargedAcrossAResume(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	f := new(FaultNet)
	cfg := failConfig("n", 50*time.Millisecond, 5*time.Second)
	cfg.MaxRefDialsPerPeer = 2
	n := startOn(t, f, cfg)
	dead := make(chan DeadLetter, 16)
	SubscribeChan(n, dead)
	resumed := make(chan PeerResumed, 4)
	SubscribeChan(n, resumed)
	if _, err := Spawn(n, "fan", Behavior[refList]{Receive: func(_ *Context[refList], m refList) {
		for _, r := range m.Refs {
			r.Tell(testPing{N: 1})
		}
	}}); err != nil {
		t.Fatal(err)
	}
	peer := startOn(t, f, failConfig("peer", 50*time.Millisecond, 5*time.Second))
	fan, err := Resolve[refList](ctxT(t, 5*time.Second), peer, FormatRef(n.Addrs()[0], "/user/fan"))
	if err != nil {
		t.Fatal(err)
	}
	var xs []*Node
	var refs []Ref[testPing]
	var got []chan testPing
	for i := range 4 {
		x := startOn(t, f, failConfig(fmt.Sprintf("x%d", i), 50*time.Millisecond, 5*time.Second))
		_, ch := spawnCollector[testPing](t, x, "sink", 16)
		r, err := Resolve[testPing](ctxT(t, 5*time.Second), peer, FormatRef(x.Addrs()[0], "/user/sink"))
		if err != nil {
			t.Fatal(err)
		}
		xs, refs, got = append(xs, x), append(refs, r), append(got, ch)
	}
	fan.Tell(refList{Refs: refs[:2]})
	for i := range 2 {
		recv(t, got[i], "a send through the peer's ref")
	}
	for i := range 2 {
		if f.Reset(n, xs[i]) == 0 {
			t.Fatal("no connection to reset")
		}
		recv(t, resumed, "the resume")
	}
	fan.Tell(refList{Refs: refs[2:]})
	for range 2 {
		if d := recv(t, dead, "a dead letter past the bound"); !errors.Is(d.Reason, ErrTooManyConns) {
			t.Fatalf("dead letter: %v", d.Reason)
		}
	}
}

// A binding that this node's own dial found, or that a second ref holds,
// is not forgotten when a ref to it goes (from the review of #34: a
// binding forgotten while it dialed left a connection nobody tracked).
func TestABindingInUseIsNotForgotten(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	n := startNode(t, testConfig("tcp://127.0.0.1:0"))
	ad := tcpAddr("127.0.0.1:9")
	live := func(a *assoc) bool {
		n.peers.mu.Lock()
		defer n.peers.mu.Unlock()
		_, ok := n.peers.all[a]
		return ok && n.peers.byAddr[ad] == a
	}
	a, held, err := n.peers.assocHeld(ad, false, NodeUID{1})
	if err != nil || !held {
		t.Fatalf("a new binding: held %v, %v", held, err)
	}
	if b, held, _ := n.peers.assocHeld(ad, false, NodeUID{2}); b != a || !held {
		t.Fatal("a second ref to the same node did not share and hold the binding")
	}
	n.peers.releaseBinding(a)
	if !live(a) {
		t.Fatal("a binding a second ref holds was forgotten")
	}
	if own, err := n.peers.assocAt(ad, true, NodeUID{}); err != nil || own != a {
		t.Fatalf("this node's own lookup: %v", err)
	}
	n.peers.releaseBinding(a)
	if !live(a) {
		t.Fatal("a binding this node's own dial found was forgotten")
	}
	c, held, _ := n.peers.assocHeld(tcpAddr("127.0.0.1:10"), false, NodeUID{1})
	n.peers.releaseBinding(c)
	if live(c) {
		t.Fatal("a binding no ref holds was kept")
	}
}

// A remote Ask through an adapter ends when the adapter's actor stops,
// and the watch it placed frees its place (from the review of #34).
func TestARemoteAskThroughAnAdapterEndsWhenItsActorStops(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	cfg := testConfig("tcp://127.0.0.1:0")
	served := startNode(t, cfg)
	adapters := make(chan Ref[testPing], 1)
	if _, err := Spawn(served, "owner", Behavior[string]{
		Setup: func(c *Context[string]) {
			adapters <- MessageAdapter(c, func(testPing) string { return "boom" })
		},
		Receive: func(_ *Context[string], m string) { panic("the request stops the actor") },
	}); err != nil {
		t.Fatal(err)
	}
	ad := recv(t, adapters, "the adapter")
	asker := startNode(t, testConfig("tcp://127.0.0.1:0"))
	remote, err := Resolve[testPing](ctxT(t, 5*time.Second), asker, FormatRef(served.Addrs()[0], ad.h.key.path))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = Ask(ctx, remote, func(r Ref[testPong]) testPing { return testPing{ReplyTo: r} })
	var ae *AskError
	if !errors.As(err, &ae) {
		t.Fatalf("a remote Ask through the adapter of an actor that panicked: %v", err)
	}
	waitFor(t, 5*time.Second, "the Ask's watch to free its place", func() bool { return watchesHeld(served) == 0 })
}
