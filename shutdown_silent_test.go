package troupe

import (
	"context"
	"testing"
	"time"
)

// A graceful Shutdown does not wait on a peer that reads and never
// acknowledges (nor on one that went silent) past UnreachableAfter: the
// detector runs until the last writer ends, so the leaving writer's wait
// for acknowledgements ends when the peer counts as unreachable, not at
// Shutdown's deadline.
func TestAShutdownWaitsForASilentPeerOnlyUntilItIsUnreachable(t *testing.T) {
	for _, audible := range []bool{true, false} {
		cfg := failConfig("n", 50*time.Millisecond, 500*time.Millisecond)
		cfg.Listen = []string{"tcp://127.0.0.1:0"}
		n := startNode(t, cfg)
		var uid NodeUID
		if audible {
			_, uid = rawPeer(t, n, true) // beats, reads, acknowledges nothing
		} else {
			_, uid = rawHandshakeWith(t, n, helloResumable) // then nothing at all
		}
		var a *assoc
		waitFor(t, 5*time.Second, "the raw peer to be up", func() bool {
			n.pmu.Lock()
			defer n.pmu.Unlock()
			a = n.byUID[uid]
			return a != nil
		})
		h := &handle{node: n, key: refKey{node: uid, path: "/user/x", uuid: UUID{1}}, assoc: a}
		for i := range 8 {
			if err := a.tell(h, padded{N: i, Pad: "unacknowledged"}); err != nil {
				t.Fatal(err)
			}
		}
		const deadline = 8 * time.Second
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		start := time.Now()
		err := n.Shutdown(ctx)
		took := time.Since(start)
		cancel()
		if err != nil {
			t.Errorf("audible %v: Shutdown: %v", audible, err)
		}
		// The peer counts as unreachable after UnreachableAfter (0.5 s);
		// the bound leaves a loaded machine ten times that.
		if took > 5*time.Second {
			t.Errorf("audible %v: Shutdown took %v with UnreachableAfter %v", audible, took, cfg.UnreachableAfter)
		}
	}
}
