package troupe_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"troupe"
)

// BenchmarkPublish publishes to 1, 10 and 100 subscribers spread over
// three nodes (default Config, one registrar among them), from one of
// them, and waits until every subscriber has every message: ns/op is per
// publish delivered to all; wire-B/publish is what the publisher wrote
// to the other two nodes per publish (one copy per node, whatever the
// number of subscribers there).
func BenchmarkPublish(b *testing.B) {
	for _, subs := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("subscribers=%d", subs), func(b *testing.B) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			addr := l.Addr().String()
			l.Close()
			var nodes []*troupe.Node
			for i := range 3 {
				n, err := troupe.Start(context.Background(), troupe.Config{Name: fmt.Sprintf("n%d", i), Listen: []string{"tcp://127.0.0.1:0"},
					RegistryAddrs: []string{addr}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
				if err != nil {
					b.Fatal(err)
				}
				defer n.Close()
				nodes = append(nodes, n)
			}
			var got atomic.Int64
			done := make(chan struct{}, 1)
			var want atomic.Int64
			for i := range subs {
				n := nodes[i%3]
				ref, err := troupe.Spawn(n, fmt.Sprintf("s%d", i), troupe.Behavior[news]{Receive: func(*troupe.Context[news], news) {
					if got.Add(1) == want.Load() {
						done <- struct{}{}
					}
				}})
				if err != nil {
					b.Fatal(err)
				}
				if err := newsTopic.Subscribe(n, ref); err != nil {
					b.Fatal(err)
				}
			}
			pub := nodes[0]
			ctx := context.Background()
			want.Store(int64(subs))
			if err := newsTopic.Publish(ctx, pub, news{From: "pub", N: 0}); err != nil {
				b.Fatal(err)
			}
			<-done
			wire := func() (sum uint64) {
				for _, p := range pub.Stats().Peers {
					if p.UID == nodes[1].UID() || p.UID == nodes[2].UID() {
						sum += p.BytesOut
					}
				}
				return sum
			}
			got.Store(0)
			want.Store(int64(subs) * int64(b.N))
			before := wire()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if err := newsTopic.Publish(ctx, pub, news{From: "pub", N: i + 1}); err != nil {
					b.Fatal(err)
				}
			}
			select {
			case <-done:
			case <-time.After(time.Minute):
				b.Fatalf("%d of %d delivered", got.Load(), want.Load())
			}
			b.StopTimer()
			b.ReportMetric(float64(wire()-before)/float64(b.N), "wire-B/publish")
		})
	}
}
