package troupe

import (
	"sync/atomic"
	"time"
)

// The members this one saw downed, lately, and the notice that tells a
// downed member it is down when gossip cannot.
//
// Gossip tells a downed member it is down while the two can talk both
// ways. A member that can hear the others but not be heard (its outgoing
// traffic lost above TCP: a FaultNet drop, writes that stall) completes
// no handshake with them, so no gossip reaches it; the side that downed
// it must not leave it running as up beside itself. So the leader of
// that side dials it, about every downedNoticeEvery while the downing is
// remembered, with a probe whose hello names the downed incarnation
// (hello extension 6; with Config.Secret, proven by its own HMAC, since
// the challenge that authenticates a connection needs an answer the
// dialer may never hear). The downed member, if it counts the dialer as
// a member, downs itself, as when a member quarantined it
// (Cluster.downedBy). A probe that is answered was heard (the acceptor
// acts on the notice before it answers), or reached another incarnation:
// that member is told no more. One whose dial fails (the member is gone,
// or its address is unreachable) is tried again later and later. A cut
// at the IP level stops TCP both ways, and both sides see a clean split;
// over TLS the notice needs the TLS handshake, which needs both ways.

const (
	// downedNoticeEvery is how often the leader tells a member it
	// remembers downed that it is down, while probes reach it.
	downedNoticeEvery = time.Second
	// maxDownedBackoff bounds the wait before a member whose address
	// could not be dialed is tried again.
	maxDownedBackoff = 30 * time.Second
	// maxDownedNotices bounds the notices in flight at once.
	maxDownedNotices = 8
)

// downedMembers is what a member remembers of the members it saw downed
// (or removed without leaving): when, for the sharding coordinators'
// margin, and, for those it saw down, where, for the notice.
// Cluster.mu guards it.
type downedMembers struct {
	at       map[NodeUID]*downedEntry
	keep     time.Duration // how long an entry is kept
	inFlight atomic.Int32  // notices being told
}

type downedEntry struct {
	since time.Time // when it was first seen downed
	addr  Addr      // where to tell it; zero: not to be told
	next  time.Time // when it is told next
	wait  time.Duration
	busy  bool // a notice is on its way
	told  bool // a notice was answered: it heard, or another incarnation did
}

// note records m, seen downed (or removed without leaving) at now, and
// forgets entries older than keep. Only a member seen down is told so: one
// seen removed only may have left gracefully.
func (d *downedMembers) note(m Member, now time.Time, keep time.Duration) {
	if d.at == nil {
		d.at = map[NodeUID]*downedEntry{}
	}
	d.keep = keep
	e := d.at[m.UID]
	if e == nil {
		e = &downedEntry{since: now, next: now}
		d.at[m.UID] = e
	}
	if m.Status == MemberDown && e.addr == (Addr{}) && !e.told {
		e.addr = m.Addr
	}
	d.prune(now)
}

func (d *downedMembers) prune(now time.Time) {
	for uid, e := range d.at {
		if now.Sub(e.since) > d.keep {
			delete(d.at, uid)
		}
	}
}

// times returns when each member was seen downed.
func (d *downedMembers) times() map[NodeUID]time.Time {
	out := make(map[NodeUID]time.Time, len(d.at))
	for uid, e := range d.at {
		out[uid] = e.since
	}
	return out
}

// due returns the members to tell now that they are down, marks their
// notices on their way, and counts them in flight: at most
// maxDownedNotices at once. An entry is due up to early before its time
// (a turn of the loop). held reports whether a live member holds an
// address now: a later incarnation there is not told.
func (d *downedMembers) due(now time.Time, early time.Duration, held func(Addr) bool) []downedTarget {
	d.prune(now)
	var out []downedTarget
	for uid, e := range d.at {
		if e.addr == (Addr{}) || e.told || e.busy || now.Add(early).Before(e.next) || d.inFlight.Load() >= maxDownedNotices {
			continue
		}
		if held(e.addr) {
			e.told = true
			continue
		}
		e.busy = true
		d.inFlight.Add(1)
		out = append(out, downedTarget{uid: uid, addr: e.addr})
	}
	return out
}

// done records how the notice to uid went, at now: answered (it was
// heard, or another incarnation answered: told), dialed but not answered
// (the member may hear and not be heard: told again at the usual pace),
// or not dialed (tried again later, each time twice as late).
func (d *downedMembers) done(uid NodeUID, now time.Time, answered, dialed bool) {
	d.inFlight.Add(-1)
	e := d.at[uid]
	if e == nil {
		return
	}
	e.busy = false
	switch {
	case answered:
		e.told = true
	case dialed:
		e.wait = 0
		e.next = now.Add(downedNoticeEvery)
	default:
		e.wait = min(max(2*e.wait, downedNoticeEvery), maxDownedBackoff)
		e.next = now.Add(e.wait)
	}
}

type downedTarget struct {
	uid  NodeUID
	addr Addr
}
