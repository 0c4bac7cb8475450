package troupe_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"troupe"
)

// hit is the benchmarks' entity message: the entity answers ReplyTo, if
// set, and counts the rest.
type hit struct {
	N       int
	ReplyTo troupe.Ref[int]
}

func init() { troupe.SetWireKey[hit]("troupe.test.sharding.hit") }

// benchCluster starts n members in this process (real TCP on loopback,
// default Config but a quiet logger), each running the kind "bench"
// whose entities count what they get in handled.
func benchCluster(b *testing.B, n int, handled *atomic.Int64, scfg troupe.ShardingConfig) ([]*troupe.Node, []*troupe.Cluster, []*troupe.Sharded[hit]) {
	b.Helper()
	var nodes []*troupe.Node
	var members []*troupe.Cluster
	var kinds []*troupe.Sharded[hit]
	for i := range n {
		nd, c := benchMember(b, fmt.Sprint("m", i), nodes)
		nodes, members = append(nodes, nd), append(members, c)
		for !allUp(members, len(members)) {
			time.Sleep(5 * time.Millisecond)
		}
		k, err := troupe.Sharding(c, "bench", benchEntity(handled), scfg)
		if err != nil {
			b.Fatal(err)
		}
		kinds = append(kinds, k)
	}
	return nodes, members, kinds
}

func benchMember(b *testing.B, name string, others []*troupe.Node) (*troupe.Node, *troupe.Cluster) {
	nd, err := troupe.Start(context.Background(), troupe.Config{Name: name, Listen: []string{"127.0.0.1:0"},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { nd.Close() })
	cfg := troupe.ClusterConfig{}
	if len(others) > 0 {
		cfg.Seeds = []string{others[0].Addrs()[0].String()}
	}
	c, err := troupe.StartCluster(context.Background(), nd, cfg)
	if err != nil {
		b.Fatal(err)
	}
	return nd, c
}

func benchEntity(handled *atomic.Int64) func(string) troupe.Behavior[hit] {
	return func(string) troupe.Behavior[hit] {
		return troupe.Behavior[hit]{Receive: func(_ *troupe.Context[hit], m hit) {
			if !m.ReplyTo.IsZero() {
				m.ReplyTo.Tell(m.N)
				return
			}
			handled.Add(1)
		}}
	}
}

// percentile returns the p-th percentile of ds (sorted in place).
func percentile(ds []time.Duration, p float64) time.Duration {
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(float64(len(ds))*p))]
}

// heapNow returns the live heap after a collection.
func heapNow() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkSharding100k: 100,000 entities over 5 members in one process
// (each a node on loopback TCP). Cold activation is an Ask from member
// 0 to an entity never sent to (4 in 5 run on another member); the
// rate is Tells from member 0 to the active entities, in turn, until
// all are handled; memory is the heap growth over the 100,000 idle
// entities (all five members' share: they live in this process).
func BenchmarkSharding100k(b *testing.B) {
	var handled atomic.Int64
	_, _, kinds := benchCluster(b, 5, &handled, troupe.ShardingConfig{})
	measureEntities(b, &handled, kinds[0].Entity)
}

// measureEntities reports, for 100,000 entities reached through ref: the
// latency of a cold entity's first Ask (p50, p99), the heap each idle
// entity holds, and the rate of Tells to the active ones (10 rounds, in
// turn, until all are handled, which handled counts).
func measureEntities(b *testing.B, handled *atomic.Int64, ref func(id string) troupe.Ref[hit]) {
	const entities, rounds = 100000, 10
	ctx := context.Background()
	ask := func(id string) time.Duration {
		at := time.Now()
		if _, err := troupe.Ask(ctx, ref(id), func(r troupe.Ref[int]) hit { return hit{N: 1, ReplyTo: r} }); err != nil {
			b.Fatal(err)
		}
		return time.Since(at)
	}
	ask("warm") // (a shard's first placement is not an activation's cost)
	base := heapNow()
	lat := make([]time.Duration, 0, entities)
	for i := range entities {
		lat = append(lat, ask(fmt.Sprint("e-", i)))
	}
	grown := heapNow() - base
	b.ReportMetric(float64(percentile(lat, 0.5).Microseconds()), "µs-activation-p50")
	b.ReportMetric(float64(percentile(lat, 0.99).Microseconds()), "µs-activation-p99")
	b.ReportMetric(float64(grown)/entities, "B/idle-entity")
	at := time.Now()
	for r := range rounds {
		for i := range entities {
			ref(fmt.Sprint("e-", i)).Tell(hit{N: r})
		}
	}
	for handled.Load() < rounds*entities {
		time.Sleep(time.Millisecond)
	}
	b.ReportMetric(rounds*entities/time.Since(at).Seconds(), "msgs/s")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkLocalMapFloor is the floor the sharding figures are compared
// with: a map of actors by id on one node, an actor spawned on an id's
// first message, with the same Ask and Tell.
func BenchmarkLocalMapFloor(b *testing.B) {
	var handled atomic.Int64
	nd, err := troupe.Start(context.Background(), troupe.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	defer nd.Close()
	refs := map[string]troupe.Ref[hit]{}
	measureEntities(b, &handled, func(id string) troupe.Ref[hit] {
		r, ok := refs[id]
		if !ok {
			if r, err = troupe.Spawn(nd, "", benchEntity(&handled)(id)); err != nil {
				b.Fatal(err)
			}
			refs[id] = r
		}
		return r
	})
}

// delays is what the rebalance benchmark's entities record: messages
// handled, the longest a message took, and how many took over 100 ms.
type delays struct {
	handled, most, slow atomic.Int64
}

func (d *delays) entity(string) troupe.Behavior[hit] {
	return troupe.Behavior[hit]{Receive: func(_ *troupe.Context[hit], m hit) {
		took := time.Now().UnixNano() - int64(m.N)
		for {
			old := d.most.Load()
			if took <= old || d.most.CompareAndSwap(old, took) {
				break
			}
		}
		if took > int64(100*time.Millisecond) {
			d.slow.Add(1)
		}
		d.handled.Add(1)
	}}
}

// BenchmarkShardingRebalance: 10,000 entities over 5 members (as in
// BenchmarkSharding100k), 1,000 shards, under a steady 10,000 messages/s
// from member 0; then a sixth member joins, or member 4 leaves. The
// figures: the time until every shard runs again where the coordinator
// placed it (the members' shard counts add up to 1,000 and the joiner
// has its share, or the leaver has none), the longest a message took,
// how many took over 100 ms, and how many were lost.
func BenchmarkShardingRebalance(b *testing.B) {
	for _, how := range []string{"join", "leave"} {
		b.Run(how, func(b *testing.B) {
			for range b.N {
				shardingRebalance(b, how)
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

func shardingRebalance(b *testing.B, how string) {
	const entities = 10000
	d := &delays{}
	var nodes []*troupe.Node
	var members []*troupe.Cluster
	var kinds []*troupe.Sharded[hit]
	join := func() {
		nd, c := benchMember(b, fmt.Sprint("m", len(nodes)), nodes)
		nodes, members = append(nodes, nd), append(members, c)
		for !allUp(members, len(members)) {
			time.Sleep(5 * time.Millisecond)
		}
		k, err := troupe.Sharding(c, "bench", d.entity, troupe.ShardingConfig{})
		if err != nil {
			b.Fatal(err)
		}
		kinds = append(kinds, k)
	}
	for range 5 {
		join()
	}
	ctx, cancel := context.WithCancel(context.Background())
	var sent atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ctx.Err() == nil; i++ {
			kinds[0].Entity(fmt.Sprint("e-", i%entities)).Tell(hit{N: int(time.Now().UnixNano())})
			sent.Add(1)
			if i%10 == 9 {
				time.Sleep(time.Millisecond)
			}
		}
	}()
	for d.handled.Load() < 3*entities { // every entity active
		time.Sleep(10 * time.Millisecond)
	}
	d.most.Store(0)
	d.slow.Store(0)
	shardsOn := func() (total int, each []int) {
		for i, k := range kinds {
			if how == "leave" && i == 4 {
				continue
			}
			n := k.Stats().Shards
			total += n
			each = append(each, n)
		}
		return total, each
	}
	at := time.Now()
	if how == "join" {
		join()
	} else {
		go members[4].Leave(context.Background())
	}
	for {
		total, each := shardsOn()
		settled := total == 1000
		if how == "join" {
			settled = settled && each[5] >= 1000/6-1
		} else {
			settled = settled && kinds[4].Stats().Shards == 0
		}
		if settled {
			break
		}
		if time.Since(at) > 2*time.Minute {
			b.Fatalf("not settled after 2 minutes: %v", each)
		}
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(at)
	time.Sleep(time.Second) // (traffic after)
	cancel()
	<-done
	for wait := time.Now(); d.handled.Load() < sent.Load() && time.Since(wait) < 10*time.Second; {
		time.Sleep(10 * time.Millisecond)
	}
	b.ReportMetric(float64(took.Milliseconds()), "ms-until-settled")
	b.ReportMetric(float64(time.Duration(d.most.Load()).Milliseconds()), "ms-longest-message")
	b.ReportMetric(float64(d.slow.Load()), "over-100ms")
	b.ReportMetric(float64(sent.Load()-d.handled.Load()), "lost")
}
