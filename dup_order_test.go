package troupe_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"troupe"
)

// seqMsg is a numbered message, for order across a simultaneous dial.
type seqMsg struct{ N int }

func init() { troupe.SetWireKey[seqMsg]("troupe.test.dup.seq") }

// Two nodes that dial each other at the same moment keep one of the two
// connections and retire the other; messages sent meanwhile, some on the
// connection being retired and the rest on the one kept, still arrive
// each once, in order, and none is a dead letter (a rolling upgrade saw
// the first message of a stream reported unconfirmed and arrive after
// the second).
func TestASimultaneousDialKeepsTheOrderOfEachStream(t *testing.T) {
	t.Parallel()
	t.Run("TCP", func(t *testing.T) {
		t.Parallel()
		simultaneousStreams(t, func(name string) *troupe.Node { return versionedNode(t, name, "") })
	})
	t.Run("FaultNet", func(t *testing.T) {
		// Its connections cannot half-close: each side ends on the
		// other's last ack.
		t.Parallel()
		f := new(troupe.FaultNet)
		simultaneousStreams(t, func(name string) *troupe.Node {
			n, err := f.Start(ctxFor(t), troupe.Config{Name: name, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { n.Close() })
			return n
		})
	})
}

// simultaneousStreams runs the rounds of
// TestASimultaneousDialKeepsTheOrderOfEachStream on nodes start makes.
func simultaneousStreams(t *testing.T, start func(name string) *troupe.Node) {
	const rounds, count = 100, 300
	for round := range rounds {
		nodes := [2]*troupe.Node{start("a"), start("b")}
		type got struct {
			mu   sync.Mutex
			last int
			bad  []string
			done chan struct{}
		}
		var gots [2]*got
		var dead [2][]string
		var dmu sync.Mutex
		for i, n := range nodes {
			g := &got{done: make(chan struct{})}
			gots[i] = g
			if _, err := troupe.Spawn(n, "seq", troupe.Behavior[seqMsg]{Receive: func(_ *troupe.Context[seqMsg], m seqMsg) {
				g.mu.Lock()
				defer g.mu.Unlock()
				if m.N != g.last+1 {
					g.bad = append(g.bad, fmt.Sprintf("%d after %d", m.N, g.last))
				}
				g.last = max(g.last, m.N)
				if m.N == count {
					close(g.done)
				}
			}}); err != nil {
				t.Fatal(err)
			}
			sub := troupe.Subscribe(n, func(d troupe.DeadLetter) {
				dmu.Lock()
				defer dmu.Unlock()
				dead[i] = append(dead[i], fmt.Sprintf("%v: %v", d.Message, d.Reason))
			})
			defer sub.Unsubscribe()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range nodes {
			from, to := nodes[i], nodes[1-i]
			wg.Go(func() {
				<-start
				r, err := troupe.Resolve[seqMsg](ctx, from, troupe.FormatRef(to.Addrs()[0], "/user/seq"))
				if err != nil {
					t.Error(err)
					return
				}
				for n := 1; n <= count; n++ {
					if err := r.Send(ctx, seqMsg{N: n}); err != nil {
						t.Errorf("send %d: %v", n, err)
						return
					}
				}
			})
		}
		close(start)
		wg.Wait()
		for i, g := range gots {
			select {
			case <-g.done:
			case <-ctx.Done():
			}
			g.mu.Lock()
			if len(g.bad) > 0 || g.last != count {
				t.Errorf("round %d, to node %d: out of order %v; last %d of %d", round, i, g.bad[:min(5, len(g.bad))], g.last, count)
			}
			g.mu.Unlock()
		}
		cancel()
		dmu.Lock()
		if len(dead[0])+len(dead[1]) > 0 {
			t.Errorf("round %d: dead letters: %v", round, dead)
		}
		dmu.Unlock()
		if t.Failed() {
			return
		}
	}
}
