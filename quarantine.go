package troupe

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Errors about unreachable peers and quarantine.
var (
	// ErrPeerUnreachable is wrapped by the [Terminated] reason a watcher
	// gets when the watched actor's node stopped answering (or its
	// connection broke without a goodbye), by the [PeerUnreachable]
	// event's reason then, and by the error of whatever waited on that
	// session (an Ask, a Send waiting for room or credit): whether the peer
	// was quarantined or is exempt from quarantine (a registrar, a cluster
	// member), so a watcher's reason does not depend on the role of the
	// node that died. The actor may well be alive: this node cannot tell.
	ErrPeerUnreachable = errors.New("troupe: peer unreachable")
	// ErrQuarantined is wrapped by the dead-letter reason of every message
	// for a quarantined peer, by the error of an [Ask] pending when the
	// peer was quarantined, and by the error of [Resolve] or a dial that
	// reaches a quarantined incarnation. Only [Node.ClearQuarantine] lifts
	// a quarantine.
	ErrQuarantined = errors.New("troupe: peer quarantined")
	// ErrQuarantinedByPeer is wrapped by the error of [Node.ClearQuarantine]
	// with [Reconnect] (or any dial) when the peer has quarantined this node and not yet
	// cleared it: the peer must call [Node.ClearQuarantine] first.
	// It is also wrapped by the reason of the [PeerUnreachable] event, and
	// of the [Terminated] signals, when a peer tells this node that it gave
	// up on it: this node then ends the session at once, as it would at
	// its own window, quarantining the peer in turn unless it is exempt.
	ErrQuarantinedByPeer = errors.New("troupe: the peer has quarantined this node")
)

// PeerUnreachable is published when an association with a peer ends other
// than by this node's own Close. Reason wraps [ErrPeerLeft] when the peer
// said goodbye (closed gracefully): the link simply ended. Otherwise this
// node gave up on the peer — it stayed silent for
// [Config.UnreachableAfter], or its connection broke or misbehaved — and
// Reason wraps [ErrPeerUnreachable]; Quarantined then says whether the
// peer incarnation was quarantined (false only for a peer exempt from
// quarantine: a registrar, a cluster member).
type PeerUnreachable struct {
	Addr        Addr    // an address of the peer
	UID         NodeUID // the peer incarnation's uid
	Name        string  // the peer's configured name
	Quarantined bool
	Reason      error
	// LastHeard is when the last bytes from the peer arrived (zero if
	// none ever did), from the monotonic clock: compared with the event's
	// arrival it tells a slow peer from a silent one.
	LastHeard time.Time
}

// quarantineError is the reason carried by everything a quarantine ends.
type quarantineError struct {
	peer  string
	uid   NodeUID
	cause error
}

func (e *quarantineError) Error() string {
	return fmt.Sprintf("troupe: peer %s (uid %s) is unreachable and quarantined: %v", e.peer, e.uid.String()[:8], e.cause)
}

func (e *quarantineError) Unwrap() []error {
	return []error{ErrPeerUnreachable, ErrQuarantined, e.cause}
}

// unreachableError is the failure of a session that ended without a
// goodbye from either side: it reads as its cause and wraps
// ErrPeerUnreachable.
type unreachableError struct{ cause error }

func (e *unreachableError) Error() string   { return e.cause.Error() }
func (e *unreachableError) Unwrap() []error { return []error{ErrPeerUnreachable, e.cause} }

// Quarantine entries are listed for QuarantineExpiry; then the addresses
// they hold are freed (ClearQuarantine no longer finds them by address)
// and the uid alone stays refused, as a tombstone, until maxQuarantined
// newer entries push it out. Addresses never refuse a peer: only the uid
// does. An incarnation's uid never comes back, so a tombstone only
// refuses a peer that should not be there.
const maxQuarantined = 1 << 16

// quarantineTable is the node's quarantine: indexed by uid and by proven
// address, in the order entries were added. Its own lock guards it (a
// leaf: the peer table's admission reads it holding the peer table's);
// noteRefused, find, add, clear and listLive take it, the rest run under
// it.
type quarantineTable struct {
	mu     mutex[lkQuarantine]
	byUID  map[NodeUID]*quarantineEntry
	byAddr map[Addr]*quarantineEntry
	order  []*quarantineEntry // oldest first; cleared entries are skipped
	head   int                // order[:head] are gone
	next   int                // order[head:next] have expired already
	dead   int                // cleared entries still in order[head:]
}

type quarantineEntry struct {
	info    quarantineInfo
	expired bool // its addresses are freed; the uid is a tombstone
	cleared bool
	logged  bool // a refusal of this incarnation was logged
}

// noteRefused records that the incarnation uid was refused, and reports
// whether it is the first refusal of it (the one that is logged).
func (t *quarantineTable) noteRefused(uid NodeUID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.byUID[uid]
	if e == nil || e.logged {
		return false
	}
	e.logged = true
	return true
}

// find returns the live entry covering uid or one of addrs, expiring
// entries older than expiry (relative to now) on the way.
func (t *quarantineTable) find(now time.Time, expiry time.Duration, uid NodeUID, addrs ...Addr) *quarantineInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expire(now, expiry)
	if e := t.byUID[uid]; e != nil {
		return &e.info
	}
	for _, a := range addrs {
		if e := t.byAddr[a]; e != nil {
			return &e.info
		}
	}
	return nil
}

// add records a quarantine, unless its uid is quarantined already.
func (t *quarantineTable) add(q quarantineInfo) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byUID == nil {
		t.byUID, t.byAddr = make(map[NodeUID]*quarantineEntry), make(map[Addr]*quarantineEntry)
	}
	if t.byUID[q.UID] != nil {
		return
	}
	e := &quarantineEntry{info: q}
	t.byUID[q.UID] = e
	for _, a := range q.Addrs {
		t.byAddr[a] = e
	}
	t.order = append(t.order, e)
	for len(t.byUID) > maxQuarantined || t.head < len(t.order) && t.order[t.head].cleared {
		t.remove(t.order[t.head])
		t.pop()
	}
	t.sweep()
}

// pop drops the oldest slot of order (a cleared entry), compacting now
// and then.
func (t *quarantineTable) pop() {
	t.order[t.head] = nil
	t.dead--
	t.head++
	t.next = max(t.next, t.head)
	if t.head > 1024 && t.head > len(t.order)/2 {
		t.order = t.order[:copy(t.order, t.order[t.head:])]
		t.next -= t.head
		t.head = 0
	}
}

// sweep drops the cleared entries from order once they outnumber the
// live ones (and are more than a few): pop takes only a cleared head, and
// one entry that stays at the head (live, or a tombstone) would otherwise
// keep every entry cleared behind it, so that order grew with each add
// and clear.
func (t *quarantineTable) sweep() {
	if t.dead < 64 || t.dead <= len(t.byUID) {
		return
	}
	kept, next := t.order[:0], 0
	for i := t.head; i < len(t.order); i++ {
		e := t.order[i]
		if e.cleared {
			continue
		}
		if i < t.next {
			next++ // (checked by expire already)
		}
		kept = append(kept, e)
	}
	clear(t.order[len(kept):])
	t.order, t.head, t.next, t.dead = kept, 0, next, 0
}

// expire frees the addresses of entries older than expiry.
func (t *quarantineTable) expire(now time.Time, expiry time.Duration) {
	for ; t.next < len(t.order); t.next++ {
		e := t.order[t.next]
		if e.cleared {
			continue
		}
		if now.Sub(e.info.Since) < expiry {
			return
		}
		e.expired = true
		t.freeAddrs(e)
	}
}

func (t *quarantineTable) freeAddrs(e *quarantineEntry) {
	for _, a := range e.info.Addrs {
		if t.byAddr[a] == e {
			delete(t.byAddr, a)
		}
	}
}

// remove lifts an entry entirely.
func (t *quarantineTable) remove(e *quarantineEntry) {
	if e == nil || e.cleared {
		return
	}
	e.cleared = true
	t.dead++
	t.freeAddrs(e)
	if t.byUID[e.info.UID] == e {
		delete(t.byUID, e.info.UID)
	}
}

// clear lifts every entry match selects; it reports whether any did.
func (t *quarantineTable) clear(match func(*quarantineInfo) bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	any := false
	for _, e := range t.byUID {
		if match(&e.info) {
			t.remove(e)
			any = true
		}
	}
	t.sweep()
	return any
}

// listLive expires the entries older than expiry (relative to now) and
// copies those whose addresses are still refused, oldest first.
func (t *quarantineTable) listLive(now time.Time, expiry time.Duration) []quarantineInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expire(now, expiry)
	var out []quarantineInfo
	for _, e := range t.order[t.head:] {
		if e == nil || e.cleared || e.expired {
			continue
		}
		c := e.info
		c.Addrs = slices.Clone(c.Addrs)
		c.Announced = slices.Clone(c.Announced)
		out = append(out, c)
	}
	return out
}

// isQuarantined reports whether the incarnation uid is quarantined here.
func (pt *peerTable) isQuarantined(uid NodeUID) bool {
	return pt.quarantineFor(uid) != nil
}

// quarantineFor returns the quarantine entry covering uid or any of addrs.
func (pt *peerTable) quarantineFor(uid NodeUID, addrs ...Addr) *quarantineInfo {
	return pt.quarantine.find(time.Now(), pt.n.cfg.QuarantineExpiry, uid, addrs...)
}

// logRefusedQuarantined says, once per incarnation, that a connection
// of a quarantined peer was refused, and what would lift the quarantine.
func (pt *peerTable) logRefusedQuarantined(a *assoc, h *hello, q *quarantineInfo) {
	lift := "troupe quarantine clear " + h.uid.String()
	if len(q.Addrs) > 0 {
		lift = "troupe quarantine clear " + q.Addrs[0].String()
	}
	if addrs := pt.n.addrList(); len(addrs) > 0 {
		lift += " --node " + addrs[0].String()
	}
	pt.n.log.Warn("troupe: refused a connection of a quarantined peer incarnation; a new incarnation (a restart) is admitted, this one only after its quarantine is lifted",
		"peer", h.name, "uid", h.uid.String(), "since", q.Since.Format(time.RFC3339), "cause", q.Cause,
		"lift", lift+" (or Node.ClearQuarantine in code)")
}

// addQuarantine records that this node gave up on a's peer.
func (pt *peerTable) addQuarantine(a *assoc, cause error) {
	// Only a proven address is quarantined: one this node dialed and found
	// the peer at. An address the peer merely announced may be another
	// node's, which must not be refused for this peer's faults.
	pt.mu.Lock()
	proven := slices.Clone(a.tab.proven) // (the table's entry: under its lock)
	pt.mu.Unlock()
	pt.quarantine.add(quarantineInfo{UID: a.peer.uid, Name: a.peer.name, Addrs: proven, Announced: slices.Clone(a.peer.addrs), Since: time.Now(), Cause: cause})
}

// quarantined lists the peers this node has quarantined and not yet
// cleared, whose quarantine has not expired ([Config.QuarantineExpiry]):
// Stats.Quarantined.
func (pt *peerTable) quarantined() []quarantineInfo {
	return pt.quarantine.listLive(time.Now(), pt.n.cfg.QuarantineExpiry)
}

// ClearOption adjusts [Node.ClearQuarantine].
type ClearOption func(*clearConfig)

type clearConfig struct {
	reconnect bool
	onNode    bool // OnNode was given (with node, which may be empty: an error)
	node      string
}

// Reconnect makes [Node.ClearQuarantine] associate with the peer again once
// its quarantine is lifted, and wait for the handshake: the peer must be
// named by an address. Refs obtained before the quarantine stay dead
// (they belong to the ended session): resolve again.
func Reconnect() ClearOption { return func(c *clearConfig) { c.reconnect = true } }

// OnNode makes [Node.ClearQuarantine] ask the node listening at address
// (in any form [ParseAddr] accepts), through this node, to lift its own
// quarantine of the peer, instead of lifting this node's. That node
// checks this one's credentials like any peer's. This is what troupe
// quarantine clear does.
func OnNode(address string) ClearOption {
	return func(c *clearConfig) { c.onNode, c.node = true, address }
}

// ClearQuarantine lifts this node's quarantine of peer, so that the peer
// may connect again, or this node may dial it. peer is an address in any
// form [ParseAddr] accepts (and with it every other address that peer
// announced), or a peer incarnation's uid in hex as [NodeUID.String],
// [Stats] and troupe peers print it (for a peer that announced no listen
// address, one that only dials out). It reports whether the peer was
// quarantined, and fails with an error wrapping [ErrBadAddr] for a peer
// that is neither.
//
// By itself it does not connect. With [Reconnect] it then associates with
// the peer again: if the peer has not cleared its own quarantine of this
// node, that fails with an error wrapping [ErrQuarantinedByPeer]; it may
// also fail with the dial or handshake error, ctx.Err(), or
// [ErrNodeClosed]. With [OnNode] it lifts another node's quarantine
// instead, and reports whether that node had the peer quarantined.
func (n *Node) ClearQuarantine(ctx context.Context, peer string, opts ...ClearOption) (bool, error) {
	var cfg clearConfig
	for _, o := range opts {
		o(&cfg)
	}
	addr, aerr := ParseAddr(peer)
	if aerr != nil && !isUIDText(peer) {
		return false, fmt.Errorf("%w: %q is neither an address nor a peer uid (32 hex digits)", ErrBadAddr, peer)
	}
	switch {
	case cfg.onNode && cfg.reconnect:
		return false, fmt.Errorf("%w: ClearQuarantine with both Reconnect and OnNode", ErrBadConfig)
	case cfg.onNode:
		return n.clearQuarantineAt(ctx, cfg.node, peer)
	}
	cleared := n.peers.clearQuarantineOf(peer)
	if !cfg.reconnect {
		return cleared, nil
	}
	if aerr != nil {
		return cleared, fmt.Errorf("reconnect: %w (a uid names no address to dial)", aerr)
	}
	a, err := n.peers.assocFor(addr)
	if err != nil {
		return cleared, err
	}
	if err := a.awaitUp(ctx); err != nil {
		return cleared, fmt.Errorf("reconnect %s: %w", addr, err)
	}
	return cleared, nil
}

// clearQuarantineOf lifts the quarantine of the peer named by an address
// (and of every other address it announced) or by its uid in hex (as
// Stats and troupe peers print it).
func (pt *peerTable) clearQuarantineOf(peer string) bool {
	var match func(q *quarantineInfo) bool
	if addr, err := ParseAddr(peer); err == nil {
		match = func(q *quarantineInfo) bool {
			return slices.Contains(q.Addrs, addr) || slices.Contains(q.Announced, addr)
		}
	} else if b, err := hex.DecodeString(peer); err == nil && len(b) == len(NodeUID{}) {
		uid := NodeUID(b)
		match = func(q *quarantineInfo) bool { return q.UID == uid }
	} else {
		return false
	}
	return pt.quarantine.clear(match)
}
