package troupe

import (
	"context"
	"testing"
	"time"
)

// An Ask to an actor on a cluster member that is downed (by an operator,
// here, while the link is healthy) fails at once, not at its deadline
// (issue #26, item 5: "or its node is declared unreachable").
func TestAnAskToADownedMemberFailsAtOnce(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	r := newClusterRig(t, 3, ClusterConfig{})
	asker, target := r.nodes[0], r.nodes[2]
	asked := make(chan struct{}, 1)
	if _, err := Spawn(target, "mute", Behavior[testPing]{Receive: func(*Context[testPing], testPing) { asked <- struct{}{} }}); err != nil {
		t.Fatal(err)
	}
	mute, err := Resolve[testPing](ctxT(t, 5*time.Second), asker, FormatRef(target.Addrs()[0], "/user/mute"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := Ask(ctx, mute, func(reply Ref[testPong]) testPing { return testPing{ReplyTo: reply} })
		done <- err
	}()
	recv(t, asked, "the request at the actor, which never answers")
	if err := r.members[0].Down(target.Addrs()[0].String()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || err == context.DeadlineExceeded {
			t.Fatalf("the Ask to a downed member ended with %v", err)
		}
		t.Logf("the Ask ended with: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("the Ask to a downed member still waited 15 s later")
	}
}
