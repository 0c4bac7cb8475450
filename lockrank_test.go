package troupe

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestTheLockOrderIsChecked: in a race build, locks taken in order, two
// associations' (which nest) and a TryLock out of order (it cannot
// block) pass; a lock taken while one ranked after it is held ends the
// process before it blocks, naming both, even in an actor's handler,
// whose panics the node recovers.
func TestTheLockOrderIsChecked(t *testing.T) {
	t.Parallel()
	if !raceEnabled || !lockTrack.on || lockTrack.record {
		t.Skip("the lock order is checked in race builds of the tests")
	}
	if c := os.Getenv("TROUPE_LOCKRANK_CASE"); c != "" {
		lockOrderCase(t, c)
		return
	}
	var peers mutex[lkPeers]
	var a, b mutex[lkAssoc]
	var actors rwMutex[lkActors]
	peers.Lock()
	a.Lock()
	b.Lock() // two associations: a merge's
	actors.RLock()
	actors.RUnlock()
	b.Unlock()
	a.Unlock()
	peers.Unlock()
	a.Lock()
	if !peers.TryLock() {
		t.Fatal("TryLock of a free lock failed")
	}
	peers.Unlock()
	a.Unlock()

	for _, c := range []struct{ name, want string }{
		{"peers under an association", "taking Peers while holding Assoc"},
		{"an association under the actor table", "taking Assoc while holding Actors"},
		{"two peer tables", "taking Peers while holding Peers"},
		{"in a handler", "taking Peers while holding Assoc"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestTheLockOrderIsChecked$", "-test.v")
		cmd.Env = append(os.Environ(), "TROUPE_LOCKRANK_CASE="+c.name)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), "troupe: lock order: "+c.want) {
			t.Errorf("%s: the process ended with %v, saying:\n%s\nwant exit status 2 and %q", c.name, err, out, c.want)
		}
	}
}

// lockOrderCase takes locks out of order, as the case c says: it never
// returns.
func lockOrderCase(t *testing.T, c string) {
	var peers, p2 mutex[lkPeers]
	var a mutex[lkAssoc]
	var actors rwMutex[lkActors]
	switch c {
	case "peers under an association":
		a.Lock()
		peers.Lock()
	case "an association under the actor table":
		actors.RLock()
		a.Lock()
	case "two peer tables":
		peers.Lock()
		p2.Lock()
	case "in a handler":
		n := startNode(t, testConfig("tcp://127.0.0.1:0"))
		taken := make(chan struct{})
		ref, err := Spawn(n, "out-of-order", Behavior[string]{Receive: func(_ *Context[string], _ string) {
			a.Lock()
			defer a.Unlock() // (a recovered panic would leave nothing held)
			peers.Lock()
			close(taken) // (never: the process ends first)
		}})
		if err != nil {
			t.Fatal(err)
		}
		ref.Tell("go")
		select {
		case <-taken:
		case <-time.After(10 * time.Second):
		}
	}
	t.Fatalf("case %q: the process goes on", c)
}
