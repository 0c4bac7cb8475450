package troupe

import (
	"errors"
	"testing"
	"time"
)

// A registration that failed while its registrar stayed up (a cut of the
// link shorter than the window: the request may arrive late, or never if
// the session ends, and the node cannot tell which) is sent again, and
// until the registrar has confirmed it the node is not ready (issue #26:
// Ready checks that its names are registered; before, a failed
// registration was only logged, and sent again only to a new registrar
// incarnation).
func TestAFailedRegistrationIsSentAgain(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	f := new(FaultNet)
	reg := freeRegistryAddr(t, "tcp")
	cfg := func(name string) Config {
		c := failConfig(name, 50*time.Millisecond, 10*time.Second)
		c.RegistryAddrs = []string{reg}
		// Short, so that the registration made during the cut times out
		// soon, but not so short that the registration Start makes
		// times out on a loaded machine (300 ms did, under -race).
		c.RegistryTimeout = 2 * time.Second
		return c
	}
	registrar := startOn(t, f, cfg("registrar"))
	if !registrar.registrar.isRegistrar() {
		t.Fatal("the first node is not the registrar")
	}
	n := startOn(t, f, cfg("n"))
	if err := n.Ready(); err != nil {
		t.Fatalf("Ready before: %v", err)
	}
	f.Partition(n, registrar) // shorter than the window: the session stays
	spawnEcho(t, n, "late")   // its registration times out
	if err := n.Ready(); !errors.Is(err, ErrNotReady) {
		t.Fatalf("Ready with a registration pending: %v", err)
	}
	f.Heal()
	waitFor(t, 10*time.Second, "the name registered again", func() bool {
		_, err := FindActor[testPing](ctxT(t, time.Second), registrar, "late")
		return err == nil
	})
	waitFor(t, 5*time.Second, "the node ready again", func() bool { return n.Ready() == nil })
}
