package troupe

import (
	"strings"
	"testing"
)

// TestTheLockOrderIsChecked: in a race build, a lock taken while one
// ranked after it is held panics before it blocks, naming both; locks
// taken in order, two associations' (which nest), and a TryLock out of
// order (it cannot block) pass.
func TestTheLockOrderIsChecked(t *testing.T) {
	t.Parallel()
	if !raceEnabled || !lockTrack.on || lockTrack.record {
		t.Skip("the lock order is checked in race builds of the tests")
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

	outOfOrder := func(what string, take func(), want string) {
		t.Helper()
		defer func() {
			msg, _ := recover().(string)
			if !strings.Contains(msg, want) {
				t.Errorf("%s: recovered %q, want a panic saying %q", what, msg, want)
			}
		}()
		take()
	}
	a.Lock()
	outOfOrder("the peer table under an association", peers.Lock, "taking Peers while holding Assoc")
	if !peers.TryLock() {
		t.Fatal("TryLock of a free lock failed")
	}
	peers.Unlock()
	a.Unlock()
	actors.Lock()
	outOfOrder("an association under the actor table", a.Lock, "taking Assoc while holding Actors")
	actors.Unlock()
	var p2 mutex[lkPeers]
	peers.Lock()
	outOfOrder("two peer tables", p2.Lock, "taking Peers while holding Peers")
	peers.Unlock()
	// Nothing is held now: what panicked was never recorded as held.
	a.Lock()
	peers.TryLock()
	peers.Unlock()
	a.Unlock()
	peers.Lock()
	a.Lock()
	a.Unlock()
	peers.Unlock()
}
