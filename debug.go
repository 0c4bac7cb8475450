package troupe

import (
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"maps"
	"math"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DebugHandler serves a live view of n for operators: an HTML page of
// [Node.Stats] (peers and how close each is to being declared unreachable,
// quarantines and why, the deepest mailboxes, the actor tree with
// restarts, dead letters by reason and the recent ones, the cluster's
// members with a banner when it cannot converge, the process's numbers)
// that refreshes itself every two seconds, and the same
// snapshot as JSON when asked with ?format=json or an Accept header of
// application/json. Mount it where you like, behind your own
// authentication: it shows addresses and names to whoever can reach it.
func (n *Node) DebugHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := n.Stats()
		if r.URL.Query().Get("format") == "json" || strings.Contains(r.Header.Get("Accept"), "application/json") {
			w.Header().Set("Content-Type", "application/json")
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			enc.Encode(statsJSON(s))
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		if err := debugPage.Execute(w, pageData(s, n.actorList(math.MaxInt))); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
}

// seconds gives a duration in seconds, as the stats document gives every
// duration (a number a dashboard can plot, its key ending in _seconds),
// to three or four significant figures: to the microsecond under a
// millisecond, to 100 µs under a second, to the millisecond above. A
// stats document is read by people and dashboards, and nanoseconds of a
// window that moves every heartbeat are noise.
func seconds(d time.Duration) float64 {
	switch {
	case d >= time.Second:
		d = d.Round(time.Millisecond)
	case d >= time.Millisecond:
		d = d.Round(100 * time.Microsecond)
	default:
		d = d.Round(time.Microsecond)
	}
	return d.Seconds()
}

// ms is t to the millisecond, as the stats document gives times.
func ms(t time.Time) time.Time { return t.Truncate(time.Millisecond) }

// MarshalJSON encodes s as the debug page's JSON document (what
// [Node.DebugHandler] serves with ?format=json): addresses and uids as
// text, durations as numbers of seconds in keys ending in _seconds,
// causes as their messages. So json.Marshal(n.Stats()), and an expvar.Func
// returning it, give what a dashboard or troupe's command line reads.
func (s Stats) MarshalJSON() ([]byte, error) { return json.Marshal(statsJSON(s)) }

// statsJSON is Stats with its addresses and uids as text and its
// durations in seconds.
func statsJSON(s Stats) map[string]any {
	peers := []map[string]any{}
	for _, p := range s.Peers {
		peers = append(peers, map[string]any{
			"addr": p.Addr.String(), "uid": p.UID.String(), "name": p.Name, "app_version": p.AppVersion, "state": p.State, "outbound": p.Outbound,
			"since": ms(p.Since), "last_heard": ms(p.LastHeard), "window_left_seconds": seconds(p.WindowLeft), "member": p.Member,
			"bytes_in": p.BytesIn, "bytes_out": p.BytesOut, "messages_in": p.MessagesIn, "messages_out": p.MessagesOut,
			"phi": p.Phi, "round_trip_seconds": seconds(p.RoundTrip), "queued": p.Queued, "unacked_bytes": p.Unacked,
		})
	}
	quarantined := []map[string]any{}
	for _, q := range s.Quarantined {
		quarantined = append(quarantined, map[string]any{"uid": q.UID.String(), "name": q.Name, "addrs": addrStrings(q.Addrs), "since": ms(q.Since), "cause": fmt.Sprint(q.Cause)})
	}
	members := []map[string]any{}
	for _, m := range s.Members {
		members = append(members, map[string]any{"addr": m.Addr.String(), "uid": m.UID.String(), "name": m.Name, "status": m.Status.String(), "up_number": m.UpNumber, "app_version": m.AppVersion, "reachable": m.Reachable, "self": m.Self, "leader": m.Leader})
	}
	recent := []map[string]any{}
	for _, d := range s.RecentDeadLetters {
		recent = append(recent, map[string]any{"at": ms(d.At), "target": d.Target, "type": d.Type, "reason": d.Reason})
	}
	return map[string]any{
		"name": s.Name, "uid": s.UID.String(), "app_version": s.AppVersion, "addrs": addrStrings(s.Addrs), "taken": s.Taken,
		"peers": peers, "observers": s.Observers, "quarantined": quarantined, "actors": s.Actors, "mailboxes": s.Mailboxes,
		"dead_letters": s.DeadLetters, "members": members, "totals": map[string]uint64{
			"actor_failures": s.Totals.ActorFailures, "actor_restarts": s.Totals.ActorRestarts, "peer_sessions": s.Totals.PeersConnected,
			"peers_given_up": s.Totals.PeersGivenUp, "peers_left": s.Totals.PeersLeft, "peer_links_lost": s.Totals.LinksLost,
			"peer_links_resumed": s.Totals.LinksResumed, "protocol_errors": s.Totals.ProtocolErrors, "auth_refused": s.Totals.AuthRefused,
		}, "cluster_blocked": s.ClusterBlocked, "registrar": s.Registrar, "registrations": s.Registrations, "registry_pending": s.RegistryPending,
		"recent_dead_letters": recent, "runtime": map[string]any{
			"version": s.Runtime.Version, "go_version": s.Runtime.GoVersion, "uptime_seconds": seconds(s.Runtime.Uptime), "goroutines": s.Runtime.Goroutines,
			"heap_bytes": s.Runtime.HeapBytes, "gc_cycles": s.Runtime.GCCycles, "gc_pause_p99_seconds": seconds(s.Runtime.GCPauseP99),
		},
	}
}

func addrStrings(as []Addr) []string {
	out := []string{}
	for _, a := range as {
		out = append(out, a.String())
	}
	return out
}

// pageData is what the page template shows.
// maxPageActors bounds the actors the page's tree shows.
const maxPageActors = 500

// pageActor is one row of the page's actor tree.
type pageActor struct {
	mailboxStats
	Name   string // the last element of the path
	Indent int    // its depth below /user or /system, in em
}

func pageData(s Stats, actors []mailboxStats) map[string]any {
	more := 0
	if len(actors) > maxPageActors {
		more, actors = len(actors)-maxPageActors, actors[:maxPageActors]
	}
	tree := make([]pageActor, 0, len(actors))
	for _, a := range actors {
		depth := strings.Count(a.Path, "/") - 1
		tree = append(tree, pageActor{mailboxStats: a, Name: a.Path[strings.LastIndexByte(a.Path, '/')+1:], Indent: 1 + 2*max(0, depth-1)})
	}
	return map[string]any{"S": s, "Reasons": slices.Sorted(maps.Keys(s.DeadLetters)), "Taken": s.Taken.Format(time.RFC3339),
		"Tree": tree, "MoreActors": more}
}

// pageDuration writes a duration for people: to the millisecond from a
// second up, to the microsecond below; "-" for one never measured (zero).
func pageDuration(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d >= time.Second || d <= -time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Microsecond && d > -time.Microsecond:
		return d.String()
	}
	return d.Round(time.Microsecond).String()
}

// pageLeft writes the window a peer has left: rounded as pageDuration
// does, and "0s (expired)" when it has run out.
func pageLeft(d time.Duration) string {
	if d <= 0 {
		return "0s (expired)"
	}
	return pageDuration(d)
}

// pagePhi writes a phi value to two decimals, without the "-0.00" of a
// tiny negative.
func pagePhi(phi float64) string {
	if phi < 0.005 {
		phi = 0
	}
	return strconv.FormatFloat(phi, 'f', 2, 64)
}

// pageBytes writes a byte count with a binary unit.
func pageBytes(b uint64) string {
	const unit = 1024
	if b < unit {
		return strconv.FormatUint(b, 10) + " B"
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return strconv.FormatFloat(float64(b)/float64(div), 'f', 1, 64) + " " + "KMGTPE"[exp:exp+1] + "iB"
}

var debugPage = template.Must(template.New("debug").Funcs(template.FuncMap{"dur": pageDuration, "left": pageLeft, "phi": pagePhi, "bytes": pageBytes}).Parse(`<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="2">
<title>troupe {{.S.Name}}</title>
<style>body{font-family:sans-serif;margin:1em}table{border-collapse:collapse;margin-bottom:1em}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}.bad{color:#b00}.banner{background:#fee;border:1px solid #b00;padding:6px;font-weight:bold}</style>
</head><body>
<h1>troupe node {{.S.Name}}</h1>
{{if .S.ClusterBlocked}}<p id="banner" class="banner bad">{{.S.ClusterBlocked}}</p>{{end}}
<p id="runtime">troupe {{.S.Runtime.Version}} · {{.S.Runtime.GoVersion}} · up {{dur .S.Runtime.Uptime}} · {{.S.Runtime.Goroutines}} goroutines · heap {{bytes .S.Runtime.HeapBytes}} · {{.S.Runtime.GCCycles}} GC cycles, pauses p99 {{dur .S.Runtime.GCPauseP99}}</p>
<p>uid {{.S.UID}}{{if .S.AppVersion}} · version <span id="app-version">{{.S.AppVersion}}</span>{{end}} · listening on {{range .S.Addrs}}{{.}} {{end}}· {{.S.Actors}} actors{{if .S.Registrar}} · registrar of {{.S.Registrations}} registrations{{end}} · taken {{.Taken}} (refreshes every 2 s; <a href="?format=json">JSON</a>)</p>
<h2>Peers</h2>
<table id="peers"><tr><th>address</th><th>name</th><th>version</th><th>uid</th><th>state</th><th>since</th><th>window left / phi</th><th>round trip</th><th>messages in/out</th><th>bytes in/out</th><th>queued</th><th>unacked</th></tr>
{{range .S.Peers}}<tr class="peer" data-uid="{{.UID}}"><td>{{.Addr}}</td><td>{{.Name}}</td><td class="version">{{.AppVersion}}</td><td>{{.UID}}</td><td class="state">{{.State}}{{if .Member}} (member){{end}}</td><td>{{.Since.Format "15:04:05"}}</td><td>{{if .Member}}phi {{phi .Phi}}{{else}}{{left .WindowLeft}}{{end}}</td><td>{{dur .RoundTrip}}</td><td>{{.MessagesIn}} / {{.MessagesOut}}</td><td>{{.BytesIn}} / {{.BytesOut}}</td><td>{{.Queued}}</td><td>{{.Unacked}}</td></tr>
{{else}}<tr><td colspan="12">no peers</td></tr>{{end}}</table>
{{if .S.Observers}}<p id="observers">and {{.S.Observers}} observer(s) (such as the troupe command), not listed</p>{{end}}
<h2>Quarantined</h2>
<table id="quarantined"><tr><th>name</th><th>uid</th><th>addresses</th><th>since</th><th>cause</th></tr>
{{range .S.Quarantined}}<tr class="quarantined bad" data-uid="{{.UID}}"><td>{{.Name}}</td><td>{{.UID}}</td><td>{{range .Addrs}}{{.}} {{end}}</td><td>{{.Since.Format "15:04:05"}}</td><td>{{.Cause}}</td></tr>
{{else}}<tr><td colspan="5">nobody</td></tr>{{end}}</table>
<h2>Deepest mailboxes</h2>
<table id="mailboxes"><tr><th>actor</th><th>waiting</th></tr>
{{range .S.Mailboxes}}<tr><td>{{.Path}}</td><td>{{.Waiting}}</td></tr>{{else}}<tr><td colspan="2">all empty</td></tr>{{end}}</table>
<h2>Actors</h2>
<table id="actors"><tr><th>actor (children below their parent)</th><th>path</th><th>waiting</th><th>restarts</th></tr>
{{range .Tree}}<tr class="actor" data-path="{{.Path}}"><td style="padding-left:{{.Indent}}em">{{.Name}}</td><td>{{.Path}}</td><td>{{.Waiting}}</td><td{{if .Restarts}} class="bad"{{end}}>{{.Restarts}}</td></tr>
{{end}}{{if .MoreActors}}<tr><td colspan="4">and {{.MoreActors}} more (troupe actors --node lists up to 10,000)</td></tr>{{end}}</table>
<h2>Dead letters</h2>
<table id="deadletters"><tr><th>reason</th><th>count</th></tr>
{{range .Reasons}}<tr><td>{{.}}</td><td>{{index $.S.DeadLetters .}}</td></tr>{{else}}<tr><td colspan="2">none</td></tr>{{end}}</table>
{{if .S.RecentDeadLetters}}<table id="recent-deadletters"><tr><th>when</th><th>target</th><th>type</th><th>reason</th></tr>
{{range .S.RecentDeadLetters}}<tr class="deadletter"><td>{{.At.Format "15:04:05.000"}}</td><td>{{.Target}}</td><td>{{.Type}}</td><td>{{.Reason}}</td></tr>
{{end}}</table>{{end}}
{{if .S.Members}}<h2>Cluster</h2>
{{if .S.ClusterBlocked}}<p id="blocked" class="bad">{{.S.ClusterBlocked}}</p>{{end}}
<table id="members"><tr><th>address</th><th>name</th><th>uid</th><th>version</th><th>status</th><th>up number</th><th>reachable</th><th></th></tr>
{{range .S.Members}}<tr class="member{{if .Self}} self{{end}}{{if .Leader}} leader{{end}}"><td>{{.Addr}}</td><td>{{or .Name "—"}}</td><td>{{.UID}}</td><td class="version">{{.AppVersion}}</td><td>{{.Status}}</td><td>{{.UpNumber}}</td><td{{if not .Reachable}} class="bad"{{end}}>{{.Reachable}}</td><td>{{if .Self}}(this node) {{end}}{{if .Leader}}leader{{end}}</td></tr>{{end}}</table>{{end}}
</body></html>
`))

// MetricsHandler serves n's numbers in the Prometheus text format, for
// the usual scrapers: a build-info series; peers by state; per peer
// (labelled by its address and name, never by its uid, so that a peer's
// restart does not start new series) bytes and messages in and out,
// frames queued, bytes unacknowledged and held, the window left or phi,
// and the round trip; quarantines; actors and the deepest mailboxes (at
// most 10, labelled by path); dead letters by reason; the totals since
// the node started (actor failures and restarts, sessions, peers given up
// on or gone, link flaps and resumes, protocol errors); cluster members
// by status; and, kept from the moment MetricsHandler is called for n,
// histograms of handler time, mailbox wait and Ask round trips by message type
// (latency.go). It is written by hand, with no dependency.
func (n *Node) MetricsHandler() http.Handler {
	n.lat.CompareAndSwap(nil, &nodeLatencies{}) // keep the histograms from now on
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		writeMetrics(w, n.Stats())
		writeLatencies(w, n.lat.Load())
	})
}

// newerSession reports whether p is the session a peer's series follows
// rather than q (the same address and name): one that is up, then the
// newest, then by uid, so that the choice does not change from scrape to
// scrape.
func newerSession(p, q peerStats) bool {
	if (p.State == "up") != (q.State == "up") {
		return p.State == "up"
	}
	if !p.Since.Equal(q.Since) {
		return p.Since.After(q.Since)
	}
	return p.UID.String() > q.UID.String()
}

// metricsValue writes a sample's value: whole numbers without an
// exponent, others in the shortest form that reads back the same.
func metricsValue(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// metricsLabel makes a label value valid UTF-8 of at most 255 bytes (a
// peer's name comes from its hello: one invalid byte would make a scraper
// refuse the whole page) and escapes it as the text format asks.
func metricsLabel(v string) string {
	if len(v) > 255 {
		v = v[:255]
	}
	return labelEscaper.Replace(strings.ToValidUTF8(v, "\uFFFD"))
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func writeMetrics(w io.Writer, s Stats) {
	metric := func(name, help, kind string) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, kind)
	}
	metric("troupe_build_info", "troupe's version, its wire protocol, the Go version, and the node's Config.AppVersion; always 1.", "gauge")
	fmt.Fprintf(w, "troupe_build_info{version=\"%s\",protocol=\"%d\",go_version=\"%s\",app_version=\"%s\"} 1\n",
		metricsLabel(Version), ProtocolVersion, metricsLabel(runtime.Version()), metricsLabel(s.AppVersion))
	metric("troupe_peers", "Associations with other nodes, by state.", "gauge")
	byState := map[string]int{}
	for _, p := range s.Peers {
		byState[p.State]++
	}
	for _, st := range assocStateNames { // every state, so that a flapping link (suspended) is counted
		fmt.Fprintf(w, "troupe_peers{state=%q} %d\n", st, byState[st])
	}
	metric("troupe_observers", "Observers (Config.Observer, such as the troupe command) connected; not counted as peers.", "gauge")
	fmt.Fprintf(w, "troupe_observers %d\n", s.Observers)
	// One series per peer address and name: of two sessions with one
	// (a new incarnation while the old one ends), the one up.
	var peers []peerStats
	seen := map[string]int{}
	for _, p := range s.Peers {
		k := p.Addr.String() + "\x00" + p.Name
		if i, ok := seen[k]; ok {
			if newerSession(p, peers[i]) {
				peers[i] = p
			}
			continue
		}
		seen[k] = len(peers)
		peers = append(peers, p)
	}
	perPeer := func(name, help, kind string, value func(peerStats) (float64, bool)) {
		metric(name, help, kind)
		for _, p := range peers {
			if v, ok := value(p); ok {
				fmt.Fprintf(w, "%s{peer=\"%s\",name=\"%s\"} %s\n", name, metricsLabel(p.Addr.String()), metricsLabel(p.Name), metricsValue(v))
			}
		}
	}
	always := func(f func(peerStats) float64) func(peerStats) (float64, bool) {
		return func(p peerStats) (float64, bool) { return f(p), true }
	}
	perPeer("troupe_peer_received_bytes_total", "Bytes read from a peer's connection.", "counter", always(func(p peerStats) float64 { return float64(p.BytesIn) }))
	perPeer("troupe_peer_sent_bytes_total", "Bytes written to a peer's connection.", "counter", always(func(p peerStats) float64 { return float64(p.BytesOut) }))
	perPeer("troupe_peer_received_messages_total", "Messages received from a peer (as of the last acknowledgement).", "counter", always(func(p peerStats) float64 { return float64(p.MessagesIn) }))
	perPeer("troupe_peer_sent_messages_total", "Messages written to a peer.", "counter", always(func(p peerStats) float64 { return float64(p.MessagesOut) }))
	perPeer("troupe_peer_queued_frames", "Frames waiting to be written to a peer.", "gauge", always(func(p peerStats) float64 { return float64(p.Queued) }))
	perPeer("troupe_peer_unacked_bytes", "Bytes of messages written to a peer and not yet acknowledged.", "gauge", always(func(p peerStats) float64 { return float64(p.Unacked) }))
	perPeer("troupe_peer_held_bytes", "Bytes a peer's association holds against Config.SendQueueLimit.", "gauge", always(func(p peerStats) float64 { return float64(p.Held) }))
	perPeer("troupe_peer_window_left_seconds", "How long a peer (not a cluster member) may stay silent before it is declared unreachable.", "gauge",
		func(p peerStats) (float64, bool) { return p.WindowLeft.Seconds(), !p.Member })
	perPeer("troupe_peer_phi", "A cluster member's phi-accrual suspicion (unreachable at the detector's threshold, 8 by default).", "gauge",
		func(p peerStats) (float64, bool) { return p.Phi, p.Member })
	perPeer("troupe_peer_round_trip_seconds", "The round trip to a peer, as the handshake measured it (this node dialed).", "gauge",
		func(p peerStats) (float64, bool) { return p.RoundTrip.Seconds(), p.RoundTrip > 0 })
	metric("troupe_quarantined_peers", "Peers this node has quarantined.", "gauge")
	fmt.Fprintf(w, "troupe_quarantined_peers %d\n", len(s.Quarantined))
	if s.Registrar {
		metric("troupe_registrations", "Registrations this registrar holds.", "gauge")
		fmt.Fprintf(w, "troupe_registrations %d\n", s.Registrations)
	}
	metric("troupe_actors", "Actors living on the node.", "gauge")
	fmt.Fprintf(w, "troupe_actors %d\n", s.Actors)
	// The deepest mailboxes by path would be series that come and go as
	// actors change places in the top ten: the metrics give the deepest
	// depth, and the page and troupe actors say whose it is.
	metric("troupe_mailbox_waiting_messages_max", "Messages waiting in the node's deepest mailbox (troupe actors, or the debug page, says whose).", "gauge")
	deepest := 0
	for _, m := range s.Mailboxes {
		deepest = max(deepest, m.Waiting)
	}
	fmt.Fprintf(w, "troupe_mailbox_waiting_messages_max %d\n", deepest)
	metric("troupe_dead_letters_total", "Messages that could not be delivered, by reason (every reason, from 0).", "counter")
	for _, r := range deadLetterReasonNames() {
		fmt.Fprintf(w, "troupe_dead_letters_total{reason=%q} %d\n", r, s.DeadLetters[r])
	}
	t := s.Totals
	for _, c := range []struct {
		name, help string
		v          uint64
	}{
		{"troupe_actor_failures_total", "Actors that failed (a panic or a reported failure).", t.ActorFailures},
		{"troupe_actor_restarts_total", "Failed actors their supervision restarted.", t.ActorRestarts},
		{"troupe_peer_sessions_total", "Sessions with a peer that came up.", t.PeersConnected},
		{"troupe_peers_given_up_total", "Peers declared unreachable: silent, broken or misbehaving (quarantined unless cluster members or registrars).", t.PeersGivenUp},
		{"troupe_peers_left_total", "Peers that said goodbye.", t.PeersLeft},
		{"troupe_peer_links_lost_total", "Links that broke under a session that may resume.", t.LinksLost},
		{"troupe_peer_links_resumed_total", "Sessions resumed over a new connection.", t.LinksResumed},
		{"troupe_protocol_errors_total", "Connections closed for a protocol error (refused authentications not included).", t.ProtocolErrors},
		{"troupe_auth_refused_total", "Connections refused because the peer failed authentication or claimed another's session.", t.AuthRefused},
	} {
		metric(c.name, c.help, "counter")
		fmt.Fprintf(w, "%s %d\n", c.name, c.v)
	}
	r := s.Runtime
	for _, g := range []struct {
		name, help, kind string
		v                float64
	}{
		{"go_goroutines", "Goroutines in the process.", "gauge", float64(r.Goroutines)},
		{"go_memstats_heap_alloc_bytes", "Bytes in live and not yet swept heap objects.", "gauge", float64(r.HeapBytes)},
		{"go_gc_cycles_total", "Garbage collections completed since the process started.", "counter", float64(r.GCCycles)},
		{"go_gc_pause_p99_seconds", "The 99th percentile of the process's stop-the-world GC pauses (the upper bound of its histogram bucket).", "gauge", r.GCPauseP99.Seconds()},
		{"troupe_uptime_seconds", "Seconds since the node started.", "gauge", r.Uptime.Seconds()},
	} {
		metric(g.name, g.help, g.kind)
		fmt.Fprintf(w, "%s %s\n", g.name, metricsValue(g.v))
	}
	if len(s.Members) > 0 {
		metric("troupe_cluster_members", "Cluster members as this member sees them, by status.", "gauge")
		byStatus := map[string]int{}
		for _, m := range s.Members {
			byStatus[m.Status.String()]++
		}
		for st := MemberJoining; st <= MemberRemoved; st++ {
			fmt.Fprintf(w, "troupe_cluster_members{status=%q} %d\n", st, byStatus[st.String()])
		}
	}
}
