package troupe_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"troupe"
)

// lockedBuffer is a log destination safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A member that crashes in a cluster without a downing strategy blocks it;
// after StableAfter the survivor says so once in its log, with the
// command that unblocks it, and in Stats for as long as it lasts. Downing
// the crashed member by hand clears it.
func TestABlockedClusterSaysHowToUnblockIt(t *testing.T) {
	f := troupe.NewFaultNet()
	var logs lockedBuffer
	start := func(name string, log *slog.Logger) *troupe.Node {
		n, err := f.Start(ctxFor(t), troupe.Config{Name: name, Logger: log, HeartbeatInterval: 20 * time.Millisecond, UnreachableAfter: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	home := start("home", slog.New(slog.NewTextHandler(&logs, nil)))
	away := start("away", slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	cfg := troupe.ClusterConfig{StableAfter: 300 * time.Millisecond}
	c, err := troupe.StartCluster(ctxFor(t), home, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Seeds = []string{home.Addrs()[0].String()}
	if _, err := troupe.StartCluster(ctxFor(t), away, cfg); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "two members up", func() bool {
		up := 0
		for _, m := range c.Members() {
			if m.Status == troupe.MemberUp {
				up++
			}
		}
		return up == 2
	})
	if b := home.Stats().ClusterBlocked; b != "" {
		t.Fatalf("a healthy cluster says it is blocked: %s", b)
	}
	f.Kill(away) // a crash: no leave
	awayAddr := away.Addrs()[0].String()
	waitUntil(t, 10*time.Second, "Stats to say the cluster is blocked", func() bool {
		return home.Stats().ClusterBlocked != ""
	})
	want := "troupe down " + awayAddr + " --node " + home.Addrs()[0].String()
	if b := home.Stats().ClusterBlocked; !strings.Contains(b, want) {
		t.Errorf("Stats.ClusterBlocked = %q, want it to name %q", b, want)
	}
	// Logged once, however long it lasts.
	time.Sleep(500 * time.Millisecond) // more turns of the loop, each of which could log again
	if got := strings.Count(logs.String(), "cluster blocked"); got != 1 {
		t.Errorf("logged %d times, want once:\n%s", got, logs.String())
	}
	if err := c.Down(awayAddr); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the block to clear once the member is downed", func() bool {
		return home.Stats().ClusterBlocked == ""
	})
}
