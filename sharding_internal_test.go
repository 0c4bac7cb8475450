package troupe

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// A member event (which pokes every region) while Sharding is being
// called: the region is seen only once whole.
func TestAPokeWhileShardingStartsIsSafe(t *testing.T) {
	f := NewFaultNet()
	n := startOn(t, f, failConfig("alone", 20*time.Millisecond, 2*time.Second))
	c, err := StartCluster(ctxT(t, 5*time.Second), n, clusterCfg(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var stop atomic.Bool
	panicked := make(chan any, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				panicked <- p
			}
		}()
		for !stop.Load() {
			c.pokeRegions()
		}
	}()
	for i := range 200 {
		if _, err := Sharding(c, fmt.Sprint("k", i), func(string) Behavior[int] { return Behavior[int]{} }, ShardingConfig{Shards: 1}); err != nil {
			t.Fatal(err)
		}
		select {
		case p := <-panicked:
			stop.Store(true)
			t.Fatalf("pokeRegions panicked during Sharding (kind %d): %v", i, p)
		default:
		}
	}
	stop.Store(true)
}

// goneAfter: an unreachable member is away until it is reachable again;
// a downed or removed one is away for good.
func TestGoneAfter(t *testing.T) {
	self, a := NodeUID{1}, NodeUID{2}
	ev := func(kind string, st MemberStatus) MemberEvent {
		return MemberEvent{Member: Member{UID: a, Status: st}, Kind: kind}
	}
	steps := []struct {
		event MemberEvent
		away  bool // a is away after it
	}{
		{ev(EventMemberUnreachable, MemberUp), true},
		{ev(EventMemberUnreachable, MemberUp), true},
		{ev(EventMemberReachable, MemberUp), false},
		{ev(EventMemberReachable, MemberUp), false},
		{ev(EventMemberUnreachable, MemberUp), true},
		{ev(EventMemberStatus, MemberDown), true},
		{ev(EventMemberReachable, MemberUp), true}, // (downed: for good)
		{ev(EventMemberStatus, MemberRemoved), true},
	}
	var cur *map[NodeUID]bool
	for i, st := range steps {
		if m := goneAfter(cur, []MemberEvent{st.event}, self); m != nil {
			cur = &m
		}
		_, away := (*cur)[a]
		if away != st.away {
			t.Fatalf("step %d (%s %s): away %v; want %v", i, st.event.Kind, st.event.Member.Status, away, st.away)
		}
	}
	if m := goneAfter(cur, []MemberEvent{{Member: Member{UID: self, Status: MemberDown}, Kind: EventMemberStatus}}, self); m != nil {
		t.Fatal("this member's own event changed the set")
	}
}

// A message left in a region's mailbox when it stops is a dead letter of
// the user's message, to the entity, with ErrEntityUnavailable: not of
// troupe's envelope.
func TestAnEnvelopesDeadLetterNamesTheUsersMessage(t *testing.T) {
	n := startNode(t, failConfig("a", 20*time.Millisecond, 2*time.Second))
	dead := make(chan DeadLetter, 1)
	sub := SubscribeChan(n.Events(), dead)
	defer sub.Unsubscribe()
	n.deadLetter("/system/sharding-k", shardEnvelope[testPing]{id: "x", msg: testPing{N: 7}, to: "/system/sharding-k/entity/x"}, ErrActorStopped)
	d := <-dead
	if m, ok := d.Message.(testPing); !ok || m.N != 7 || d.Target != "/system/sharding-k/entity/x" || !errors.Is(d.Reason, ErrEntityUnavailable) {
		t.Fatalf("dead letter %T %+v to %s (%v); want the testPing to the entity, ErrEntityUnavailable", d.Message, d.Message, d.Target, d.Reason)
	}
}
