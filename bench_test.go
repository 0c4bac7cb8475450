package troupe

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Floors: what the same work costs without troupe, measured in the same run.

func BenchmarkFloorChannel(b *testing.B) {
	ch := make(chan count, 1024)
	done := make(chan struct{})
	go func() {
		for range b.N {
			<-ch
		}
		close(done)
	}()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		ch <- count{N: i}
	}
	<-done
}

// echoChannels is the floor's ping-pong partner: a goroutine that sends
// back on rep what comes on req, until req is closed.
func echoChannels() (req, rep chan count) {
	req, rep = make(chan count, 1), make(chan count, 1)
	go func() {
		for m := range req {
			rep <- m
		}
	}()
	return req, rep
}

func BenchmarkFloorChannelPingPong(b *testing.B) {
	req, rep := echoChannels()
	defer close(req)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		req <- count{N: i}
		<-rep
	}
}

// BenchmarkFloorPingPongLatency is BenchmarkFloorChannelPingPong timed
// per round trip: the floor of BenchmarkLocalAskLatency's median and 99th
// percentile.
func BenchmarkFloorPingPongLatency(b *testing.B) {
	req, rep := echoChannels()
	defer close(req)
	took := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		req <- count{N: i}
		<-rep
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	latencies(b, took)
}

// BenchmarkFloorAskDeadline is BenchmarkLocalAskDeadline without
// troupe: a request carrying a fresh reply channel to a goroutine that
// serves a channel, a context.WithTimeout per call, and a select on the
// reply and the context. It reports the same median and 99th percentile.
func BenchmarkFloorAskDeadline(b *testing.B) {
	type request struct {
		n     int
		reply chan int
	}
	reqs := make(chan request, 1)
	go func() {
		for r := range reqs {
			r.reply <- r.n
		}
	}()
	defer close(reqs)
	took := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r := request{n: i, reply: make(chan int, 1)}
		reqs <- r
		select {
		case <-r.reply:
		case <-ctx.Done():
			b.Fatal(ctx.Err())
		}
		cancel()
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	latencies(b, took)
}

// BenchmarkFloorSpawn is a spawn without troupe, an actor as a goroutine
// would be: a goroutine waiting on its own mailbox channel, entered under
// a generated name in a table behind a lock. Like BenchmarkSpawn, it keeps
// every one it made until the end, and reports the memory each holds.
func BenchmarkFloorSpawn(b *testing.B) {
	var mu sync.Mutex
	table := make(map[string]chan count)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		ch := make(chan count, 1)
		wg.Go(func() {
			select {
			case <-ch:
			case <-stop:
			}
		})
		mu.Lock()
		table["/user/$"+strconv.FormatInt(int64(i), 36)] = ch
		mu.Unlock()
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc+after.StackInuse-before.HeapAlloc-before.StackInuse)/float64(b.N), "B/idle-actor")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "spawns/s")
}

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(b *testing.B) (net.Conn, net.Conn) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		acc <- c
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	s := <-acc
	b.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

// smallFrame is the frame troupe sends for a repeated tell of count{3}.
var smallFrame = []byte{4, 4, 2, 2, 6}

func BenchmarkFloorTCPStream(b *testing.B) {
	c, s := tcpPair(b)
	done := make(chan struct{})
	go func() {
		r := bufio.NewReaderSize(s, 64<<10)
		for range b.N {
			n, _ := binary.ReadUvarint(r)
			r.Discard(int(n))
		}
		close(done)
	}()
	w := bufio.NewWriterSize(c, 64<<10)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		w.Write(smallFrame)
	}
	w.Flush()
	<-done
}

func BenchmarkFloorTCPRequestReply(b *testing.B) {
	c, s := tcpPair(b)
	go func() {
		buf := make([]byte, len(smallFrame))
		for {
			if _, err := io.ReadFull(s, buf); err != nil {
				return
			}
			s.Write(buf)
		}
	}()
	buf := make([]byte, len(smallFrame))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		c.Write(smallFrame)
		io.ReadFull(c, buf)
	}
}

func benchConfig(listen ...string) Config {
	cfg := testConfig(listen...)
	cfg.MailboxLimit = -1
	cfg.SendQueueLimit = -1
	return cfg
}

// counter spawns an actor that closes done after n messages.
func counter(b *testing.B, n *Node, name string, total int) (Ref[count], chan struct{}) {
	done := make(chan struct{})
	seen := 0
	r, err := Spawn(n, name, Behavior[count]{Receive: func(*Context[count], count) {
		if seen++; seen == total {
			close(done)
		}
	}})
	if err != nil {
		b.Fatal(err)
	}
	return r, done
}

func BenchmarkLocalTell(b *testing.B) {
	n := startNode(b, benchConfig())
	r, done := counter(b, n, "sink", b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		r.Tell(count{N: i})
	}
	<-done
}

func BenchmarkLocalAsk(b *testing.B) {
	n := startNode(b, benchConfig())
	echo := spawnEcho(b, n, "echo")
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := Ask(ctx, echo, func(r Ref[testPong]) testPing { return testPing{N: i, ReplyTo: r} }); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLocalAskLatency is BenchmarkLocalAsk timed per round trip:
// its median and 99th percentile, against BenchmarkFloorPingPongLatency.
func BenchmarkLocalAskLatency(b *testing.B) {
	n := startNode(b, benchConfig())
	echo := spawnEcho(b, n, "echo")
	ctx := context.Background()
	took := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		_, err := Ask(ctx, echo, func(r Ref[testPong]) testPing { return testPing{N: i, ReplyTo: r} })
		took = append(took, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	latencies(b, took)
}

// BenchmarkLocalAskDeadline is BenchmarkLocalAsk with a deadline per call
// (context.WithTimeout), as real callers write it, and reports the median
// and the 99th percentile of the round trips.
func BenchmarkLocalAskDeadline(b *testing.B) {
	n := startNode(b, benchConfig())
	echo := spawnEcho(b, n, "echo")
	took := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := Ask(ctx, echo, func(r Ref[testPong]) testPing { return testPing{N: i, ReplyTo: r} })
		cancel()
		took = append(took, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	latencies(b, took)
}

func benchTransports(b *testing.B, body func(b *testing.B, listen string)) {
	b.Run("tcp", func(b *testing.B) { body(b, "tcp://127.0.0.1:0") })
	b.Run("unix", func(b *testing.B) { body(b, "unix://"+shortSocket(b)) })
}

func BenchmarkRemoteTell(b *testing.B) {
	benchTransports(b, func(b *testing.B, listen string) {
		a := startNode(b, benchConfig())
		srv := startNode(b, benchConfig(listen))
		_, done := counter(b, srv, "sink", b.N+1)
		r, err := Resolve[count](context.Background(), a, FormatRef(srv.Addrs()[0], "/user/sink"))
		if err != nil {
			b.Fatal(err)
		}
		r.Tell(count{}) // define the target and type ids
		before := a.peers.bytesWritten()
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			r.Tell(count{N: i})
		}
		<-done
		b.StopTimer()
		b.ReportMetric(float64(a.peers.bytesWritten()-before)/float64(b.N), "wire-B/msg")
	})
}

func BenchmarkRemoteAsk(b *testing.B) {
	benchTransports(b, func(b *testing.B, listen string) {
		a := startNode(b, benchConfig())
		srv := startNode(b, benchConfig(listen))
		spawnEcho(b, srv, "echo")
		ctx := context.Background()
		r, err := Resolve[testPing](ctx, a, FormatRef(srv.Addrs()[0], "/user/echo"))
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if _, err := Ask(ctx, r, func(rr Ref[testPong]) testPing { return testPing{N: i, ReplyTo: rr} }); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkSpawn(b *testing.B) {
	n := startNode(b, benchConfig())
	beh := Behavior[count]{Receive: func(*Context[count], count) {}}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := Spawn(n, "", beh); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(b.N), "B/idle-actor")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "spawns/s")
}

// BenchmarkQueryActor measures a lookup answered by a registrar in another
// node over loopback TCP.
func BenchmarkQueryActor(b *testing.B) {
	reg := freeRegistryAddr(b, "tcp")
	startNode(b, discoveryConfig("registrar", reg))
	service := startNode(b, discoveryConfig("service", reg))
	spawnEcho(b, service, "svc")
	client := startNode(b, discoveryConfig("client", reg))
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := client.QueryActor(ctx, "svc"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFindActorFastPath measures a repeated lookup of an actor already
// found on a connected peer: no registrar round trip.
func BenchmarkFindActorFastPath(b *testing.B) {
	reg := freeRegistryAddr(b, "tcp")
	startNode(b, discoveryConfig("registrar", reg))
	service := startNode(b, discoveryConfig("service", reg))
	spawnEcho(b, service, "svc")
	client := startNode(b, discoveryConfig("client", reg))
	ctx := context.Background()
	if _, err := FindActor[testPing](ctx, client, "svc"); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := FindActor[testPing](ctx, client, "svc"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkActorTimers measures what an idle timer costs: 100,000 actors
// each start one that is due in an hour, and the heap grown per timer
// (beyond the actors themselves) is reported. No goroutine waits on them.
func BenchmarkActorTimers(b *testing.B) {
	const actors = 100_000
	for range b.N {
		b.StopTimer()
		n := startNode(b, benchConfig())
		started := make(chan struct{}, actors)
		beh := Behavior[count]{Receive: func(c *Context[count], m count) {
			if m.N == 1 {
				c.StartTimer("t", time.Hour, count{N: 2})
				started <- struct{}{}
			}
		}}
		refs := make([]Ref[count], actors)
		for i := range refs {
			refs[i], _ = Spawn(n, "", beh)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		goroutines := runtime.NumGoroutine()
		b.StartTimer()
		for _, r := range refs {
			r.Tell(count{N: 1})
		}
		for range actors {
			<-started
		}
		b.StopTimer()
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/actors, "B/timer")
		b.ReportMetric(float64(runtime.NumGoroutine()-goroutines), "goroutines-added")
		n.Close()
	}
}

// BenchmarkClusterScale runs clusters of 10, 30 and 100 members in one
// process on the fault network (loopback TCP), heartbeat and gossip
// interval 200 ms, no downing strategy, the rest defaults. Once every
// member sees every other up it reports, per size: the bytes each member
// writes per second at rest (measured over 3 s), the gossip intervals
// from a new member's StartCluster until every member sees it up, and
// the seconds from a member's silent death (FaultNet.Kill) until every
// other member sees it unreachable. Run it with -benchtime=1x: each
// iteration is a whole cluster.
func BenchmarkClusterScale(b *testing.B) {
	for _, size := range []int{10, 30, 100} {
		b.Run(fmt.Sprintf("members=%d", size), func(b *testing.B) {
			for range b.N {
				clusterScale(b, size)
			}
		})
	}
}

func clusterScale(b *testing.B, size int) {
	const interval = 200 * time.Millisecond
	f := new(FaultNet)
	var nodes []*Node
	var members []*Cluster
	defer func() {
		for _, c := range members {
			c.Close()
		}
		for _, n := range nodes {
			n.Close()
		}
	}()
	start := func(seeds ...string) *Cluster {
		cfg := Config{Logger: quietLogger(), HeartbeatInterval: interval}
		n, err := f.Start(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		c, err := StartCluster(context.Background(), n, ClusterConfig{Seeds: seeds})
		if err != nil {
			b.Fatal(err)
		}
		nodes, members = append(nodes, n), append(members, c)
		return c
	}
	start()
	seed := nodes[0].Addrs()[0].String()
	for range size - 1 {
		start(seed)
	}
	// everywhere waits until cond holds for every running member.
	everywhere := func(what string, limit time.Duration, cond func(c *Cluster) bool) time.Duration {
		t0 := time.Now()
		for {
			ok := true
			for _, c := range members {
				if !stopped(c) && !cond(c) {
					ok = false
					break
				}
			}
			if ok {
				return time.Since(t0)
			}
			if time.Since(t0) > limit {
				b.Fatalf("%d members: %s not reached within %v", size, what, limit)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	upCount := func(c *Cluster) int {
		n := 0
		for _, m := range c.Members() {
			if m.Status == MemberUp {
				n++
			}
		}
		return n
	}
	everywhere("all up", 2*time.Minute, func(c *Cluster) bool { return upCount(c) == size })
	time.Sleep(2 * time.Second) // let the joins' traffic settle

	sent := func() (total uint64) {
		for _, n := range nodes {
			total += f.bytesSent(n)
		}
		return total
	}
	before := sent()
	time.Sleep(3 * time.Second)
	atRest := float64(sent()-before) / float64(size) / 3

	joiner := start(seed)
	join := everywhere("the new member up", time.Minute, func(c *Cluster) bool {
		return memberStatus(c, joiner.Self().UID) == MemberUp
	})
	victim := nodes[size/2]
	f.Kill(victim)
	detect := everywhere("the dead member unreachable", time.Minute, func(c *Cluster) bool {
		if c.Self().UID == victim.UID() {
			return true
		}
		for _, m := range c.Unreachable() {
			if m.UID == victim.UID() {
				return true
			}
		}
		return false
	})
	b.ReportMetric(atRest, "B/member/s")
	b.ReportMetric(float64(join)/float64(interval), "join-intervals")
	b.ReportMetric(detect.Seconds(), "detect-s")
}

// boxed is a decoded message as it leaves the decoder: a struct of a few
// scalar fields and a string, stored indirectly in an interface.
type boxed struct {
	N    int
	Name string
	At   int64
}

// BenchmarkFastBesideSlow measures head-of-line blocking: the time per
// message of a burst sent with Send to a fast remote actor, alone
// ("solo-ns/msg") and while another sender waits for credit to a slow
// actor on the same connection ("beside-ns/msg"); "ratio" is the
// throughput beside over solo. The receiving node has MailboxLimit 50
// (otherwise the default Config); the slow actor takes 1 ms a message.
func BenchmarkFastBesideSlow(b *testing.B) {
	cfg := testConfig("tcp://127.0.0.1:0")
	cfg.MailboxLimit = 50
	away := startNode(b, cfg)
	home := startNode(b, testConfig())
	if _, err := Spawn(away, "slow", Behavior[count]{Receive: func(*Context[count], count) { time.Sleep(time.Millisecond) }}); err != nil {
		b.Fatal(err)
	}
	const burst = 200_000
	var seen atomic.Int64
	if _, err := Spawn(away, "fast", Behavior[count]{Receive: func(*Context[count], count) { seen.Add(1) }}); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	fast, err := Resolve[count](ctx, home, FormatRef(away.Addrs()[0], "/user/fast"))
	if err != nil {
		b.Fatal(err)
	}
	slow, err := Resolve[count](ctx, home, FormatRef(away.Addrs()[0], "/user/slow"))
	if err != nil {
		b.Fatal(err)
	}
	run := func() time.Duration {
		start := time.Now()
		want := seen.Load() + burst
		for i := range burst {
			if err := fast.Send(ctx, count{N: i}); err != nil {
				b.Fatal(err)
			}
		}
		for seen.Load() < want {
			runtime.Gosched()
		}
		return time.Since(start)
	}
	var solo, beside time.Duration
	for range b.N {
		run() // warm up
		solo += run()
		sctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := 0; slow.Send(sctx, count{N: i}) == nil; i++ {
			}
		}()
		beside += run()
		stop()
		<-done
	}
	b.ReportMetric(float64(solo.Nanoseconds())/float64(b.N*burst), "solo-ns/msg")
	b.ReportMetric(float64(beside.Nanoseconds())/float64(b.N*burst), "beside-ns/msg")
	b.ReportMetric(float64(solo)/float64(beside), "ratio")
}

// BenchmarkSendHeaders is Ref.Send of a small message, on the node and to
// another over TCP, without headers and with a W3C traceparent (a
// different one every 256 messages).
func BenchmarkSendHeaders(b *testing.B) {
	traces := make([]context.Context, 256)
	for i := range traces {
		traces[i] = WithHeaders(context.Background(), Headers{"traceparent": fmt.Sprintf("00-%032x-%016x-01", i*7919+1, i+1)})
	}
	for _, where := range []string{"local", "remote"} {
		for _, with := range []bool{false, true} {
			name := where + "/none"
			if with {
				name = where + "/traceparent"
			}
			b.Run(name, func(b *testing.B) {
				a := startNode(b, benchConfig())
				r, done := counter(b, a, "sink", b.N+1)
				if where == "remote" {
					srv := startNode(b, benchConfig("tcp://127.0.0.1:0"))
					_, done = counter(b, srv, "sink", b.N+1)
					var err error
					if r, err = Resolve[count](context.Background(), a, FormatRef(srv.Addrs()[0], "/user/sink")); err != nil {
						b.Fatal(err)
					}
				}
				r.Tell(count{}) // define the target and type ids
				ctx := context.Background()
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					if with {
						ctx = traces[i&255]
					}
					if err := r.Send(ctx, count{N: i}); err != nil {
						b.Fatal(err)
					}
				}
				<-done
			})
		}
	}
}
