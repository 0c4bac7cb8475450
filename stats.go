package troupe

import (
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Stats is a snapshot of what a node is doing and what it thinks of its
// peers, made by [Node.Stats]. It is plain data: print it, encode it as
// JSON (the debug page's document: [Stats.MarshalJSON]), or serve it with
// [Node.DebugHandler] and [Node.MetricsHandler].
type Stats struct {
	Name       string
	UID        NodeUID
	AppVersion string // Config.AppVersion
	Addrs      []Addr
	Taken      time.Time // when the snapshot was made

	// Peers are the associations with other nodes, by address.
	Peers []struct {
		Addr Addr
		UID  NodeUID
		Name string
		// AppVersion is the peer's Config.AppVersion, as its handshake said.
		AppVersion string
		State      string // "connecting", "up", "suspended" (a flap: see PeerLinkLost), "ending", "leaving", "retiring" or "closed"
		Outbound   bool   // this node dialed
		Since      time.Time
		// LastHeard is when anything last arrived from the peer.
		LastHeard time.Time
		// WindowLeft is how long the peer may stay silent before it is
		// declared unreachable ([Config.UnreachableAfter] minus its
		// silence); zero for a cluster member, whose detector is the
		// cluster's.
		WindowLeft time.Duration
		Member     bool // a cluster member (never quarantined)
		// Phi is, for a cluster member this member watches, its
		// phi-accrual detector's suspicion now (unreachable at the
		// detector's threshold, 8 by default); 0 otherwise.
		Phi         float64
		BytesIn     uint64 // bytes read from the connection
		BytesOut    uint64 // bytes written to it
		MessagesIn  uint64 // messages received (as of the last acknowledgement)
		MessagesOut uint64 // messages written
		// RoundTrip estimates the round trip to the peer: how long the
		// handshake's reply took, on an association this node dialed (0
		// on one the peer dialed).
		RoundTrip time.Duration
		Queued    int // frames waiting to be written
		Unacked   int // bytes of messages written and not yet acknowledged
		// Held is what the association holds against
		// Config.SendQueueLimit, in bytes: frames waiting to be written
		// (those not yet encoded, before the connection is up, count 64
		// bytes each) and Unacked.
		Held int
	}
	// Observers is how many Observers (Config.Observer: the troupe
	// command, for one) are connected; they are not listed in Peers.
	Observers int
	// Quarantined are the peer incarnations this node has quarantined and
	// not yet cleared, whose quarantine has not expired
	// ([Config.QuarantineExpiry]), with why.
	Quarantined []struct {
		UID  NodeUID
		Name string
		// Addrs are the peer's proven addresses: those this node dialed
		// and found this uid at. They name the peer for
		// [Node.ClearQuarantine] and refuse nobody: a quarantine binds the
		// incarnation (UID), so a new incarnation listening on one (a
		// restart) is admitted.
		Addrs []Addr
		// Announced are the addresses the peer claimed in its handshake.
		// They refuse nobody (they may be another node's);
		// ClearQuarantine accepts them to name the peer.
		Announced []Addr
		Since     time.Time
		Cause     error
	}
	// Actors is how many actors live on the node (system actors included).
	Actors int
	// Mailboxes are the deepest mailboxes, deepest first (at most 10, and
	// only those with messages waiting).
	Mailboxes []struct {
		Path string `json:"path"`
		// Restarts counts the times its supervisor restarted it.
		Restarts int `json:"restarts"`
		// Waiting counts the messages queued behind the batch the actor
		// is working through (it takes all that are waiting at once): a
		// mailbox that keeps growing here is one whose actor cannot keep
		// up.
		Waiting int `json:"waiting"`
	}
	// DeadLetters counts the node's dead letters since it started, by
	// reason: "actor-stopped", "no-such-actor", "wrong-type",
	// "mailbox-full", "send-queue-full", "quarantined", "peer-left",
	// "node-closed", "session-ended", "not-registered" ([ErrNoWireKey]),
	// "incompatible" or "other".
	DeadLetters map[string]uint64
	// RegistryPending counts the node's registrations and removals that
	// its etcd registry has not confirmed yet (an election, an outage):
	// the node writes them until etcd takes them.
	RegistryPending int
	// Members is the cluster membership as this node sees it, when it is
	// a cluster member.
	Members []struct {
		Member
		// Reachable reports whether this member's failure detector hears
		// the member (false for a removed member, which nobody watches).
		Reachable bool
		// Name is the member's node name, from this node's association
		// with it (empty without one).
		Name string
		// Self marks this node's own member; Leader the member this node
		// sees as the leader.
		Self, Leader bool
	}
	// ClusterBlocked, when not empty, says why this member's cluster
	// cannot converge — an unreachable member and no downing strategy to
	// act on it — and the command that would unblock it.
	ClusterBlocked string
	// Registrar says whether this node serves a registry, and
	// Registrations how many registrations it then holds.
	Registrar     bool
	Registrations int
	// Totals counts what happened since the node started.
	Totals struct {
		ActorFailures  uint64 // actors that failed (a panic, or a reported failure)
		ActorRestarts  uint64 // of those, the ones their supervision restarted
		PeersConnected uint64 // sessions with a peer that came up (a resumed one is not counted again)
		PeersGivenUp   uint64 // peers declared unreachable: silent, broken or misbehaving (quarantined, unless cluster members or registrars)
		PeersLeft      uint64 // peers that said goodbye
		LinksLost      uint64 // links that broke under a session that may resume (PeerLinkLost)
		LinksResumed   uint64 // sessions resumed over a new connection (PeerResumed)
		ProtocolErrors uint64 // connections closed for a protocol error (ProtocolError), refused authentications not included
		AuthRefused    uint64 // connections refused because the peer failed authentication or claimed another's session (a ProtocolError wrapping ErrAuth)
	}
	// RecentDeadLetters are the node's last dead letters, newest first
	// (at most 16), with what they were for and why.
	RecentDeadLetters []struct {
		At     time.Time
		Target string
		Type   string // the message's Go type
		Reason string
	}
	// Runtime describes the process the node runs in.
	Runtime struct {
		Version    string        // troupe's Version
		GoVersion  string        // runtime.Version()
		Uptime     time.Duration // since the node started
		Goroutines int
		HeapBytes  uint64 // bytes in live and not yet swept heap objects
		GCCycles   uint64 // completed since the process started
		// GCPauseP99 is the 99th percentile of the process's
		// stop-the-world pauses since it started (an upper bound: the
		// histogram bucket's).
		GCPauseP99 time.Duration
	}
}

// The element types of Stats' fields, for troupe's own code: each is
// identical to the struct written out in Stats (the compiler checks it
// wherever one is stored there), where the fields are documented.
type (
	peerStats = struct {
		Addr                                       Addr
		UID                                        NodeUID
		Name, AppVersion, State                    string
		Outbound                                   bool
		Since, LastHeard                           time.Time
		WindowLeft                                 time.Duration
		Member                                     bool
		Phi                                        float64
		BytesIn, BytesOut, MessagesIn, MessagesOut uint64
		RoundTrip                                  time.Duration
		Queued, Unacked, Held                      int
	}
	quarantineInfo = struct {
		UID              NodeUID
		Name             string
		Addrs, Announced []Addr
		Since            time.Time
		Cause            error
	}
	mailboxStats = struct {
		Path     string `json:"path"`
		Restarts int    `json:"restarts"`
		Waiting  int    `json:"waiting"`
	}
	memberStats = struct {
		Member
		Reachable    bool
		Name         string
		Self, Leader bool
	}
	totals = struct {
		ActorFailures, ActorRestarts, PeersConnected, PeersGivenUp, PeersLeft, LinksLost, LinksResumed, ProtocolErrors, AuthRefused uint64
	}
	deadLetterSample = struct {
		At                   time.Time
		Target, Type, Reason string
	}
	runtimeStats = struct {
		Version, GoVersion  string
		Uptime              time.Duration
		Goroutines          int
		HeapBytes, GCCycles uint64
		GCPauseP99          time.Duration
	}
)

// nodeTotals are the counters behind Totals.
type nodeTotals struct {
	actorFailures, actorRestarts, peersConnected, peersGivenUp, peersLeft, linksLost, linksResumed, protocolErrors, authRefused atomic.Uint64
}

func (t *nodeTotals) snapshot() totals {
	return totals{ActorFailures: t.actorFailures.Load(), ActorRestarts: t.actorRestarts.Load(), PeersConnected: t.peersConnected.Load(),
		PeersGivenUp: t.peersGivenUp.Load(), PeersLeft: t.peersLeft.Load(), LinksLost: t.linksLost.Load(),
		LinksResumed: t.linksResumed.Load(), ProtocolErrors: t.protocolErrors.Load(), AuthRefused: t.authRefused.Load()}
}

// trafficCounts is what a session carried: the counts of the
// connections before this one (a resumed session's counts go on; under
// the association's lock) and this connection's, which the writer adds.
type trafficCounts struct {
	bytesInBase, bytesOutBase, tellsOutBase uint64
	written                                 atomic.Uint64 // bytes written to the connection
	tellsOut                                atomic.Uint64 // tell frames written to the connection
}

// Stats returns a snapshot of the node: its associations, quarantines,
// actors and deepest mailboxes, dead letters by reason, and its cluster
// membership. It takes each table's lock briefly, one at a time, so the
// parts are each consistent but not taken at one instant.
func (n *Node) Stats() Stats {
	now := time.Now()
	s := Stats{Name: n.name, UID: n.uid, AppVersion: n.cfg.AppVersion, Addrs: n.Addrs(), Taken: now, DeadLetters: n.dead.counts.snapshot(), RegistryPending: n.disc.store.pending(), Totals: n.totals.snapshot()}
	if s.DeadLetters == nil {
		s.DeadLetters = map[string]uint64{}
	}
	for _, a := range n.peers.live() {
		a.mu.Lock()
		if a.peer.observer {
			a.mu.Unlock()
			s.Observers++
			continue
		}
		p := peerStats{Addr: a.addr(), UID: a.peer.uid, Name: a.peer.name, AppVersion: a.peer.appVersion, State: a.life.state.String(), Outbound: a.outbound,
			Since: a.life.upAt, Queued: a.queue.len() + a.out.frames, Unacked: a.win.unacked.bytes, Held: a.held(), BytesOut: a.traffic.bytesOutBase + a.traffic.written.Load(), Member: n.cl.isMember(a.peer.uid),
			MessagesIn: a.ackTo.Load(), MessagesOut: a.traffic.tellsOutBase + a.traffic.tellsOut.Load(), RoundTrip: a.peer.rtt, BytesIn: a.traffic.bytesInBase}
		in := a.in
		a.mu.Unlock()
		if in != nil {
			p.BytesIn += in.bytes.Load()
			if at := in.heard.Load(); at != 0 {
				p.LastHeard = n.epoch.Add(time.Duration(at))
			}
		}
		if !p.Member {
			last := p.LastHeard
			if p.Since.After(last) {
				last = p.Since
			}
			p.WindowLeft = max(0, n.cfg.UnreachableAfter-now.Sub(last))
		}
		s.Peers = append(s.Peers, p)
	}
	slices.SortFunc(s.Peers, func(a, b peerStats) int { return cmp.Compare(a.Addr.String(), b.Addr.String()) })
	s.Quarantined = n.peers.quarantined()

	all := n.actorList(math.MaxInt)
	s.Actors = len(all)
	for _, m := range all {
		if m.Waiting > 0 {
			s.Mailboxes = append(s.Mailboxes, m)
		}
	}
	slices.SortFunc(s.Mailboxes, func(a, b mailboxStats) int {
		return cmp.Or(cmp.Compare(b.Waiting, a.Waiting), cmp.Compare(a.Path, b.Path))
	})
	s.Mailboxes = s.Mailboxes[:min(len(s.Mailboxes), 10)]

	if g := n.registrar.reg(); g != nil {
		g.mu.Lock()
		s.Registrar, s.Registrations = true, len(g.entries)
		g.mu.Unlock()
	}
	if p := n.cl.plug.Load(); p != nil {
		p.addStats(&s, now)
	}
	s.RecentDeadLetters = n.dead.samples.list()
	s.Runtime = n.runtimeStats(now)
	return s
}

// runtimeStats reads the process's numbers from runtime/metrics, which
// does not stop the world.
func (n *Node) runtimeStats(now time.Time) runtimeStats {
	r := runtimeStats{Version: Version, GoVersion: runtime.Version(), Uptime: now.Sub(n.epoch)}
	samples := []metrics.Sample{{Name: "/sched/goroutines:goroutines"}, {Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/sched/pauses/total/gc:seconds"}}
	metrics.Read(samples)
	if v := samples[0].Value; v.Kind() == metrics.KindUint64 {
		r.Goroutines = int(v.Uint64())
	}
	if v := samples[1].Value; v.Kind() == metrics.KindUint64 {
		r.HeapBytes = v.Uint64()
	}
	if v := samples[2].Value; v.Kind() == metrics.KindUint64 {
		r.GCCycles = v.Uint64()
	}
	if v := samples[3].Value; v.Kind() == metrics.KindFloat64Histogram {
		r.GCPauseP99 = histogramQuantile(v.Float64Histogram(), 0.99)
	}
	return r
}

// histogramQuantile is the upper bound of the bucket that holds the q-th
// quantile of h's counts, as a duration in seconds; 0 for no counts.
func histogramQuantile(h *metrics.Float64Histogram, q float64) time.Duration {
	var total uint64
	for _, c := range h.Counts {
		total += c
	}
	if total == 0 {
		return 0
	}
	want := uint64(math.Ceil(q * float64(total)))
	var seen uint64
	for i, c := range h.Counts {
		seen += c
		if seen >= want {
			upper := h.Buckets[i+1]
			if math.IsInf(upper, 1) {
				upper = h.Buckets[i]
			}
			return time.Duration(upper * float64(time.Second))
		}
	}
	return 0
}

// statsPath is where every node's introspection actor lives: it answers
// FetchStats (and so troupe peers, actors and stats) over the protocol,
// behind the same authentication as everything else.
const statsPath = "/system/stats"

// statsRequest asks a node's introspection actor for its Stats.
type statsRequest struct {
	ReplyTo Ref[statsReply]
	// Schema asks for the node's Schema, under "schema", instead of its
	// actor list.
	Schema bool
	// Clear, when not empty, asks the node to lift its quarantine of the
	// peer at that address, or of that peer uid (in hex), first; the
	// reply says under "cleared" whether anything was quarantined.
	Clear string
}

// statsReply is a node's Stats as the JSON DebugHandler serves, with
// every actor's mailbox depth added as "actor_list".
type statsReply struct{ JSON []byte }

func init() {
	SetWireKey[statsRequest]("troupe.stats.request")
	SetWireKey[statsReply]("troupe.stats.reply")
}

// maxActorList bounds how many actors a stats reply lists.
const maxActorList = 10000

// startStatsActor spawns the node's introspection actor.
func (n *Node) startStatsActor() error {
	_, err := Spawn(systemParent{n}, "stats", Behavior[statsRequest]{Receive: func(_ *Context[statsRequest], r statsRequest) {
		var cleared bool
		if r.Clear != "" {
			cleared = n.peers.clearQuarantineOf(r.Clear)
		}
		doc := statsJSON(n.Stats())
		if r.Clear != "" {
			doc["cleared"] = cleared
		}
		if r.Schema {
			doc["schema"] = Schema()
		} else {
			doc["actor_list"] = n.actorList(maxActorList)
		}
		b, err := json.Marshal(doc)
		if err != nil {
			b = fmt.Appendf(nil, `{"error":%q}`, err.Error())
		}
		r.ReplyTo.Tell(statsReply{JSON: b})
	}})
	return err
}

// actorList is every actor's path and mailbox depth, by path, at most
// limit of them.
func (n *Node) actorList(limit int) []mailboxStats {
	handles, restarts := n.actors.list()
	out := []mailboxStats{}
	for _, h := range handles {
		if h.local == nil || h.local.watchHandle() != h {
			continue // adapters and temporary refs are not actors
		}
		m := mailboxStats{Path: h.key.path, Restarts: int(restarts[h.key.path])}
		if w, ok := h.local.(interface{ waiting() int }); ok {
			m.Waiting = w.waiting()
		}
		out = append(out, m)
	}
	// By path element, so that a child comes right after its parent even
	// when a sibling's name sorts between them ("a-b" < "a/x").
	slices.SortFunc(out, func(a, b mailboxStats) int { return comparePaths(a.Path, b.Path) })
	return out[:min(len(out), limit)]
}

// comparePaths orders actor paths element by element.
func comparePaths(a, b string) int {
	for {
		ea, ra, moreA := strings.Cut(a, "/")
		eb, rb, moreB := strings.Cut(b, "/")
		if c := cmp.Compare(ea, eb); c != 0 {
			return c
		}
		switch {
		case !moreA && !moreB:
			return 0
		case !moreA:
			return -1
		case !moreB:
			return 1
		}
		a, b = ra, rb
	}
}

// isUIDText reports whether s is a node uid as NodeUID.String writes it.
func isUIDText(s string) bool {
	b, err := hex.DecodeString(s)
	return err == nil && len(b) == len(NodeUID{})
}

// clearQuarantineAt asks the node listening at address, through n, to
// lift its quarantine of peer (see [OnNode]).
func (n *Node) clearQuarantineAt(ctx context.Context, address, peer string) (bool, error) {
	doc, err := fetchStats(ctx, n, address, statsRequest{Clear: peer})
	if err != nil {
		return false, err
	}
	var v struct {
		Cleared *bool `json:"cleared"`
	}
	if err := json.Unmarshal(doc, &v); err != nil {
		return false, fmt.Errorf("the node at %s answered with something else than its stats: %w", address, err)
	}
	if v.Cleared == nil {
		return false, fmt.Errorf("the node at %s cannot lift a quarantine when asked over the protocol (troupe before 0.11.0): clear it there", address)
	}
	return *v.Cleared, nil
}

// FetchStats asks the node listening at address for its [Node.Stats],
// through n, and returns them as the JSON document [Node.DebugHandler] serves,
// with every actor's path and mailbox depth added as "actor_list" (at
// most 10,000). The node checks n's credentials like any peer's. This is
// what troupe peers, actors and stats print.
func (n *Node) FetchStats(ctx context.Context, address string) ([]byte, error) {
	return fetchStats(ctx, n, address, statsRequest{})
}

// fetchStats asks the node at address for its stats document, with req's
// options (its ReplyTo is set here).
func fetchStats(ctx context.Context, n *Node, address string, req statsRequest) ([]byte, error) {
	addr, err := ParseAddr(address)
	if err != nil {
		return nil, err
	}
	ref, err := Resolve[statsRequest](ctx, n, FormatRef(addr, statsPath))
	if err != nil {
		return nil, fmt.Errorf("no troupe node answers at %s: %w", addr, err)
	}
	reply, err := Ask(ctx, ref, func(r Ref[statsReply]) statsRequest { req.ReplyTo = r; return req })
	if err != nil {
		return nil, err
	}
	return reply.JSON, nil
}
