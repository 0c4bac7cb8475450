package troupe_test

import (
	"errors"
	"testing"
	"time"

	"troupe"
)

// childPing asks a child to answer, so that a watcher on another node
// knows its watch, sent before the ask, is in place.
type childPing struct{ Reply troupe.Ref[string] }

func init() { troupe.SetWireKey[childPing]("troupe.test.child-ping") }

// A child stopped because its parent stopped reports ErrParentStopped to
// its watchers, on its own node and on another, whether the parent was
// stopped by Node.Stop or stopped itself with Context.Stop.
func TestAChildStoppedWithItsParentReportsErrParentStopped(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"Node.Stop", "Context.Stop"} {
		t.Run(how, func(t *testing.T) {
			here := startQuiet(t, quietConfig("here"))
			there := startQuiet(t, quietConfig("there"))
			children := make(chan troupe.Ref[childPing], 1)
			parent, err := troupe.Spawn(here, "parent", troupe.Behavior[string]{
				Setup: func(c *troupe.Context[string]) {
					child, err := troupe.Spawn(c, "child", troupe.Behavior[childPing]{Receive: func(_ *troupe.Context[childPing], m childPing) {
						m.Reply.Tell("here")
					}})
					if err != nil {
						t.Error(err)
					}
					children <- child
				},
				Receive: func(c *troupe.Context[string], m string) {
					if m == "stop" {
						c.Stop()
					}
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			child := within(t, children, 10*time.Second, "the child")
			local := watchOn(t, here, child)
			remoteChild := remoteRef[childPing](t, there, here, child.Path())
			remote := watchOn(t, there, remoteChild)
			// The watch frame goes before the ask: once the child has
			// answered, the watch is in place.
			if _, err := troupe.Ask(ctxFor(t), remoteChild, func(r troupe.Ref[string]) childPing { return childPing{Reply: r} }); err != nil {
				t.Fatal(err)
			}
			if how == "Node.Stop" {
				if err := here.Stop(parent); err != nil {
					t.Fatal(err)
				}
			} else {
				parent.Tell("stop")
			}
			for _, w := range []struct {
				name string
				ch   <-chan troupe.Terminated
			}{{"local watcher", local}, {"remote watcher", remote}} {
				tm := within(t, w.ch, 10*time.Second, "the child's Terminated for the "+w.name)
				if !errors.Is(tm.Reason, troupe.ErrParentStopped) {
					t.Errorf("%s: the child's Terminated reason = %v, want ErrParentStopped", w.name, tm.Reason)
				}
			}
		})
	}
}

// A watch that reaches the child only after it stopped with its parent —
// a remote watch frame that the stop overtakes, or a Watch placed late —
// still gets the child's real reason, ErrParentStopped, not a bare
// ErrActorStopped or ErrNoSuchActor: the node keeps the reasons of its
// last stops for such late watchers.
func TestALateWatchOfAChildStoppedWithItsParentGetsTheRealReason(t *testing.T) {
	t.Parallel()
	here := startQuiet(t, quietConfig("here"))
	there := startQuiet(t, quietConfig("there"))
	children := make(chan troupe.Ref[childPing], 1)
	parent, err := troupe.Spawn(here, "parent", troupe.Behavior[string]{
		Setup: func(c *troupe.Context[string]) {
			child, err := troupe.Spawn(c, "child", troupe.Behavior[childPing]{Receive: func(_ *troupe.Context[childPing], m childPing) {
				m.Reply.Tell("here")
			}})
			if err != nil {
				t.Error(err)
			}
			children <- child
		},
		Receive: func(*troupe.Context[string], string) {},
	})
	if err != nil {
		t.Fatal(err)
	}
	child := within(t, children, 10*time.Second, "the child")
	remoteChild := remoteRef[childPing](t, there, here, child.Path())
	stopped := watchOn(t, here, child)
	if err := here.Stop(parent); err != nil {
		t.Fatal(err)
	}
	within(t, stopped, 10*time.Second, "the child's stop")
	for _, w := range []struct {
		name string
		ch   <-chan troupe.Terminated
	}{{"a late local watch", watchOn(t, here, child)}, {"a late remote watch", watchOn(t, there, remoteChild)}} {
		tm := within(t, w.ch, 10*time.Second, "Terminated for "+w.name)
		if !errors.Is(tm.Reason, troupe.ErrParentStopped) {
			t.Errorf("%s: Terminated reason = %v, want ErrParentStopped", w.name, tm.Reason)
		}
	}
}
