//go:build unix

package troupe_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"troupe"
)

// Two builds of one service, as a rolling upgrade runs them side by side:
// the helper process registers v2's types when $TROUPE_UP_V2 is set, v1's
// otherwise, under the same wire keys. upMsg changed as the rules allow
// (fields reordered, Legacy removed, Trace added); upKind changed a
// field's kind, which the rules forbid.
type upMsgV1 struct {
	From   string
	To     string
	Seq    int64
	Legacy bool
}

type upMsgV2 struct {
	Seq   int64
	To    string
	From  string
	Trace []string
}

type upKindV1 struct {
	From string
	To   string
	Seq  int64
	Code string
}

type upKindV2 struct {
	From string
	To   string
	Seq  int64
	Code int64
}

const (
	upMsgKey  = "troupe.test.upgrade.msg"
	upKindKey = "troupe.test.upgrade.kind"
)

func init() {
	if os.Getenv("TROUPE_UP_V2") != "" {
		troupe.SetWireKey[upMsgV2](upMsgKey)
		troupe.SetWireKey[upKindV2](upKindKey)
	} else {
		troupe.SetWireKey[upMsgV1](upMsgKey)
		troupe.SetWireKey[upKindV1](upKindKey)
	}
}

// The two classes of message the service sends.
const (
	upMsg  = "msg"
	upKind = "kind"
)

// upTally is what one incarnation of a service counted, by class: what
// it sent, what it received, and its dead letters.
type upTally struct {
	mu        sync.Mutex
	self      string                                 // this incarnation's address, as its peers name it
	version   string                                 // "v1" or "v2"
	sent      map[string]map[string]int64            // class -> target address -> sent (seqs 1..n)
	got       map[string]map[string]map[int64]int    // class -> sender -> seq -> times received
	last      map[string]map[string]int64            // class -> sender -> last seq received
	dead      map[string]map[string]map[int64]string // class -> "from>to" -> seq -> reason
	incompat  map[string]map[string]int              // class -> sender's address -> incompatible dead letters here
	cross     map[string]map[int64]bool              // target address -> kinds sent to a peer of the other version
	disorder  int                                    // received out of their sender's order
	badFields int                                    // received with a field not as the rules say
	lost      int                                    // PeerUnreachable events of peers given up on
	flaps     int                                    // PeerLinkLost events
}

func newUpTally(self, version string) *upTally {
	t := &upTally{self: self, version: version, sent: map[string]map[string]int64{}, got: map[string]map[string]map[int64]int{},
		last: map[string]map[string]int64{}, dead: map[string]map[string]map[int64]string{}, incompat: map[string]map[string]int{}, cross: map[string]map[int64]bool{}}
	for _, c := range []string{upMsg, upKind} {
		t.sent[c], t.got[c], t.last[c], t.dead[c], t.incompat[c] = map[string]int64{}, map[string]map[int64]int{}, map[string]int64{}, map[string]map[int64]string{}, map[string]int{}
	}
	return t
}

// versionOf is the version in an incarnation's name ("s0-v2").
func versionOf(name string) string { return name[strings.LastIndexByte(name, '-')+1:] }

// received counts a message; fieldsOK says whether its fields are what
// the rules make of what its sender set.
func (t *upTally) received(class, from, to string, seq int64, fieldsOK bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.got[class][from] == nil {
		t.got[class][from] = map[int64]int{}
	}
	t.got[class][from][seq]++
	if seq <= t.last[class][from] {
		t.disorder++
	}
	t.last[class][from] = seq
	if !fieldsOK || to != t.self || class == upKind && versionOf(from) != t.version {
		t.badFields++
	}
}

func (t *upTally) deadLetter(d troupe.DeadLetter) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if errors.Is(d.Reason, troupe.ErrIncompatibleMessage) {
		// "…: "key" from ADDR: why": the sender is named by its address.
		text := d.Reason.Error()
		_, after, _ := strings.Cut(text, " from ")
		from, _, _ := strings.Cut(after, ": ")
		class := upMsg
		if strings.Contains(text, upKindKey) {
			class = upKind
		}
		t.incompat[class][from]++
		return
	}
	var class, from, to string
	var seq int64
	switch m := d.Message.(type) {
	case upMsgV1:
		class, from, to, seq = upMsg, m.From, m.To, m.Seq
	case upMsgV2:
		class, from, to, seq = upMsg, m.From, m.To, m.Seq
	case upKindV1:
		class, from, to, seq = upKind, m.From, m.To, m.Seq
	case upKindV2:
		class, from, to, seq = upKind, m.From, m.To, m.Seq
	default:
		return
	}
	k := from + ">" + to
	if t.dead[class][k] == nil {
		t.dead[class][k] = map[int64]string{}
	}
	reason := strings.ReplaceAll(d.Reason.Error(), " ", "_")
	if d.Unconfirmed {
		reason += "(unconfirmed)"
	}
	t.dead[class][k][seq] = reason
}

// report prints the tally, one fact a line, then END.
func (t *upTally) report(w io.Writer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range []string{upMsg, upKind} {
		for to, n := range t.sent[c] {
			fmt.Fprintf(w, "SENT %s %s %d\n", c, to, n)
		}
		for from, seqs := range t.got[c] {
			var b strings.Builder
			for seq, times := range seqs {
				fmt.Fprintf(&b, "%d:%d,", seq, times)
			}
			fmt.Fprintf(w, "GOT %s %s %s\n", c, from, b.String())
		}
		for k, seqs := range t.dead[c] {
			for seq, reason := range seqs {
				fmt.Fprintf(w, "DEAD %s %s %d %s\n", c, k, seq, reason)
			}
		}
		for from, n := range t.incompat[c] {
			fmt.Fprintf(w, "INC %s %s %d\n", c, from, n)
		}
	}
	for to, seqs := range t.cross {
		var b strings.Builder
		for seq := range seqs {
			fmt.Fprintf(&b, "%d,", seq)
		}
		fmt.Fprintf(w, "CROSS %s %s\n", to, b.String())
	}
	fmt.Fprintf(w, "COUNTS disorder=%d bad_fields=%d lost=%d flaps=%d\n", t.disorder, t.badFields, t.lost, t.flaps)
	fmt.Fprintln(w, "END")
}

// counts prints how many messages came from each sender, then END.
func (t *upTally) counts(w io.Writer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for from, seqs := range t.got[upMsg] {
		fmt.Fprintf(w, "COUNT %s %d\n", from, len(seqs))
	}
	fmt.Fprintln(w, "END")
}

// TestHelperUpgradedService is not a test: TestARollingUpgrade runs it in
// child processes. It is one incarnation of a service: a node at
// $TROUPE_UP_LISTEN named $TROUPE_UP_NAME (a cluster member when
// $TROUPE_UP_SEED is set: "self" starts the cluster), with a sink for
// upMsg and upKind, that sends both to the sinks at $TROUPE_UP_PEERS
// every few milliseconds, and answers stdin: "report" prints its tally,
// "counts" how much it received from whom, "members" its view of the
// cluster, "quiesce" stops its sending, and "stop" stops its sending,
// shuts the node down gracefully, prints its tally and exits.
func TestHelperUpgradedService(t *testing.T) {
	t.Parallel()
	listen := os.Getenv("TROUPE_UP_LISTEN")
	if listen == "" {
		t.Skip("helper for TestARollingUpgrade")
	}
	name, v2 := os.Getenv("TROUPE_UP_NAME"), os.Getenv("TROUPE_UP_V2") != ""
	version := "v1"
	if v2 {
		version = "v2"
	}
	tally := newUpTally(listen, version)
	n, err := troupe.Start(context.Background(), troupe.Config{Name: name, AppVersion: version, Listen: []string{listen},
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err != nil {
		fmt.Println("ERR", err)
		return
	}
	defer n.Close()
	troupe.Subscribe(n, tally.deadLetter)
	troupe.Subscribe(n, func(u troupe.PeerUnreachable) {
		if u.Quarantined { // (not a peer that said goodbye)
			fmt.Fprintf(os.Stderr, "%s: gave up on a peer: %+v\n", name, u)
			tally.mu.Lock()
			tally.lost++
			tally.mu.Unlock()
		}
	})
	troupe.Subscribe(n, func(troupe.PeerLinkLost) { tally.mu.Lock(); tally.flaps++; tally.mu.Unlock() })
	// What the rules make of the fields: v1 sets Legacy, which v2 lacks
	// (a v1 receiver sees it only from v1); v2 sets Trace, which v1 lacks.
	if v2 {
		_, err = troupe.Spawn(n, "msgs", troupe.Behavior[upMsgV2]{Receive: func(_ *troupe.Context[upMsgV2], m upMsgV2) {
			tally.received(upMsg, m.From, m.To, m.Seq, slices.Equal(m.Trace, map[bool][]string{true: {"x"}}[versionOf(m.From) == "v2"]))
		}})
		if err == nil {
			_, err = troupe.Spawn(n, "kinds", troupe.Behavior[upKindV2]{Receive: func(_ *troupe.Context[upKindV2], m upKindV2) {
				tally.received(upKind, m.From, m.To, m.Seq, m.Code == 7)
			}})
		}
	} else {
		_, err = troupe.Spawn(n, "msgs", troupe.Behavior[upMsgV1]{Receive: func(_ *troupe.Context[upMsgV1], m upMsgV1) {
			tally.received(upMsg, m.From, m.To, m.Seq, m.Legacy == (versionOf(m.From) == "v1"))
		}})
		if err == nil {
			_, err = troupe.Spawn(n, "kinds", troupe.Behavior[upKindV1]{Receive: func(_ *troupe.Context[upKindV1], m upKindV1) {
				tally.received(upKind, m.From, m.To, m.Seq, m.Code == "7")
			}})
		}
	}
	if err != nil {
		fmt.Println("ERR", err)
		return
	}
	var c *troupe.Cluster
	if seed := os.Getenv("TROUPE_UP_SEED"); seed != "" {
		cfg := troupe.ClusterConfig{StableAfter: time.Second}
		if seed != "self" {
			cfg.Seeds = []string{seed}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		c, err = troupe.StartCluster(ctx, n, cfg)
		for err == nil && c.Self().Status != troupe.MemberUp && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond) // (a helper process: polls its own state)
		}
		cancel()
		if err != nil || c.Self().Status != troupe.MemberUp {
			fmt.Println("ERR joining:", err, c.Self().Status)
			return
		}
	}

	// The sender: each tick, one message to every peer's msgs, and every
	// fifth tick one kind, through refs resolved by address and resolved
	// again after a dead letter (the peer at that address restarted).
	stopSending, sending := make(chan struct{}), make(chan struct{})
	var peers []string
	for _, p := range strings.Split(os.Getenv("TROUPE_UP_PEERS"), ",") {
		if p != "" {
			peers = append(peers, p)
		}
	}
	stale := make(chan string, 1024)
	troupe.Subscribe(n, func(d troupe.DeadLetter) {
		for _, p := range peers {
			if strings.HasPrefix(d.Target, troupe.FormatRef(mustAddr(p), "/user/")) {
				select {
				case stale <- p:
				default:
				}
			}
		}
	})
	go func() {
		defer close(sending)
		type refs struct {
			cross bool // the peer's incarnation runs the other version
			tell  func(seq int64)
			kind  func(seq int64)
		}
		by := map[string]*refs{}
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stopSending:
				return
			case <-tick.C:
			}
		drain:
			for {
				select {
				case p := <-stale:
					delete(by, p)
				default:
					break drain
				}
			}
			for _, p := range peers {
				r := by[p]
				if r == nil {
					ref := troupe.FormatRef(mustAddr(p), "/user/msgs")
					kref := troupe.FormatRef(mustAddr(p), "/user/kinds")
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					if v2 {
						m, err1 := troupe.Resolve[upMsgV2](ctx, n, ref)
						k, err2 := troupe.Resolve[upKindV2](ctx, n, kref)
						if err1 == nil && err2 == nil {
							r = &refs{cross: peerVersion(n, m.NodeUID()) != version, tell: func(seq int64) { m.Tell(upMsgV2{From: name, To: p, Seq: seq, Trace: []string{"x"}}) },
								kind: func(seq int64) { k.Tell(upKindV2{From: name, To: p, Seq: seq, Code: 7}) }}
						}
					} else {
						m, err1 := troupe.Resolve[upMsgV1](ctx, n, ref)
						k, err2 := troupe.Resolve[upKindV1](ctx, n, kref)
						if err1 == nil && err2 == nil {
							r = &refs{cross: peerVersion(n, m.NodeUID()) != version, tell: func(seq int64) { m.Tell(upMsgV1{From: name, To: p, Seq: seq, Legacy: true}) },
								kind: func(seq int64) { k.Tell(upKindV1{From: name, To: p, Seq: seq, Code: "7"}) }}
						}
					}
					cancel()
					if r == nil {
						continue // (restarting: try again next tick)
					}
					by[p] = r
				}
				tally.mu.Lock()
				tally.sent[upMsg][p]++
				seq := tally.sent[upMsg][p]
				kseq := int64(0)
				if i%5 == 0 {
					tally.sent[upKind][p]++
					kseq = tally.sent[upKind][p]
					if r.cross {
						if tally.cross[p] == nil {
							tally.cross[p] = map[int64]bool{}
						}
						tally.cross[p][kseq] = true
					}
				}
				tally.mu.Unlock()
				r.tell(seq)
				if kseq != 0 {
					r.kind(kseq)
				}
			}
		}
	}()
	quiesce := func() {
		select {
		case <-stopSending:
		default:
			close(stopSending)
		}
		<-sending
	}
	fmt.Printf("READY %s\n", n.Addrs()[0])
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "report":
			tally.report(os.Stdout)
		case "counts":
			tally.counts(os.Stdout)
		case "members":
			if c != nil {
				for _, m := range c.Members() {
					reachable := !slices.ContainsFunc(c.Unreachable(), func(u troupe.Member) bool { return u.UID == m.UID })
					fmt.Printf("MEMBER %s %s %s %v\n", m.Addr, m.Status, m.AppVersion, reachable)
				}
			}
			fmt.Printf("QUARANTINED %d\n", len(n.Stats().Quarantined))
			fmt.Println("END")
		case "quiesce":
			quiesce()
			fmt.Println("QUIESCED")
		case "stop":
			quiesce()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			err := n.Shutdown(ctx)
			cancel()
			if err != nil {
				fmt.Println("ERR shutdown:", err)
			}
			tally.report(os.Stdout)
			fmt.Println("STOPPED")
			return
		}
	}
	quiesce()
}

// peerVersion is the app version of the peer incarnation uid, as its
// handshake said ("" if there is no such association).
func peerVersion(n *troupe.Node, uid troupe.NodeUID) string {
	for _, p := range n.Stats().Peers {
		if p.UID == uid {
			return p.AppVersion
		}
	}
	return ""
}

func mustAddr(s string) troupe.Addr {
	a, err := troupe.ParseAddr(s)
	if err != nil {
		panic(err)
	}
	return a
}

// upProcess is one incarnation of the service in a child process.
type upProcess struct {
	name   string
	addr   string // as it says it listens
	listen string // as its peers name it
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	done   chan struct{}
}

func startUpProcess(t *testing.T, name, listen, seed string, peers []string, v2 bool) *upProcess {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := &upProcess{name: name, listen: listen, cmd: exec.Command(exe, "-test.run=^TestHelperUpgradedService$"), lines: make(chan string, 4096), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), "TROUPE_UP_LISTEN="+listen, "TROUPE_UP_NAME="+name, "TROUPE_UP_SEED="+seed,
		"TROUPE_UP_PEERS="+strings.Join(peers, ","))
	if v2 {
		p.cmd.Env = append(p.cmd.Env, "TROUPE_UP_V2=1")
	}
	p.cmd.Stderr = os.Stderr
	p.stdin, _ = p.cmd.StdinPipe()
	stdout, _ := p.cmd.StdoutPipe()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		in := bufio.NewScanner(stdout)
		in.Buffer(nil, 64<<20)
		for in.Scan() {
			p.lines <- in.Text()
		}
		close(p.lines)
		p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stdin.Close()
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	l := p.line(t, 30*time.Second)
	f := strings.Fields(l)
	if len(f) != 2 || f[0] != "READY" {
		t.Fatalf("%s said %q", name, l)
	}
	p.addr = f[1]
	return p
}

func (p *upProcess) line(t *testing.T, d time.Duration) string {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			t.Fatalf("%s ended", p.name)
		}
		return l
	case <-time.After(d):
		t.Fatalf("%s said nothing for %v", p.name, d)
		return ""
	}
}

// ask sends a command and returns the lines up to END (or the one line
// that answers it).
func (p *upProcess) ask(t *testing.T, cmd, last string) []string {
	t.Helper()
	fmt.Fprintln(p.stdin, cmd)
	var out []string
	for {
		l := p.line(t, 30*time.Second)
		if l == last {
			return out
		}
		if strings.HasPrefix(l, "ERR") {
			t.Fatalf("%s: %s", p.name, l)
		}
		out = append(out, l)
	}
}

// upLedger adds up the tallies of every incarnation, by class and by
// direction ("from>to": a sender incarnation and a receiver address).
type upLedger struct {
	sent     map[string]int64            // class|from>to -> n
	got      map[string]map[int64]int    // class|from>to -> seq -> times, over the incarnations at to
	dead     map[string]map[int64]string // class|from>to -> seq -> reason
	incompat map[string]int              // class|from's address>to -> incompatible dead letters at to
	counts   map[string]int
	restarts int
	addrOf   map[string]string         // incarnation -> its address
	cross    map[string]map[int64]bool // kind|from>to -> seqs sent to a receiver of the other version
}

func newUpLedger() *upLedger {
	return &upLedger{sent: map[string]int64{}, got: map[string]map[int64]int{}, dead: map[string]map[int64]string{},
		incompat: map[string]int{}, counts: map[string]int{}, addrOf: map[string]string{}, cross: map[string]map[int64]bool{}}
}

func (l *upLedger) clone() *upLedger {
	c := newUpLedger()
	c.restarts = l.restarts
	for k, v := range l.addrOf {
		c.addrOf[k] = v
	}
	for k, v := range l.cross {
		c.cross[k] = v // (never changed once added)
	}
	for k, v := range l.sent {
		c.sent[k] = v
	}
	for k, v := range l.got {
		c.got[k] = map[int64]int{}
		for s, n := range v {
			c.got[k][s] = n
		}
	}
	for k, v := range l.dead {
		c.dead[k] = map[int64]string{}
		for s, r := range v {
			c.dead[k][s] = r
		}
	}
	for k, v := range l.incompat {
		c.incompat[k] = v
	}
	for k, v := range l.counts {
		c.counts[k] = v
	}
	return c
}

// add folds one incarnation's report in.
func (l *upLedger) add(t *testing.T, p *upProcess, report []string) {
	t.Helper()
	l.addrOf[p.name] = p.listen
	for _, line := range report {
		f := strings.Fields(line)
		switch f[0] {
		case "SENT": // class to n
			n, _ := strconv.ParseInt(f[3], 10, 64)
			l.sent[f[1]+"|"+p.name+">"+f[2]] += n
		case "GOT": // class from seq:times,...
			k := f[1] + "|" + f[2] + ">" + p.listen
			if l.got[k] == nil {
				l.got[k] = map[int64]int{}
			}
			if len(f) > 3 {
				for _, st := range strings.Split(strings.TrimSuffix(f[3], ","), ",") {
					seq, times, _ := strings.Cut(st, ":")
					s, _ := strconv.ParseInt(seq, 10, 64)
					n, _ := strconv.Atoi(times)
					l.got[k][s] += n
				}
			}
		case "DEAD": // class from>to seq reason
			k := f[1] + "|" + f[2]
			if l.dead[k] == nil {
				l.dead[k] = map[int64]string{}
			}
			seq, _ := strconv.ParseInt(f[3], 10, 64)
			l.dead[k][seq] = f[4]
		case "CROSS": // to seq,...
			k := upKind + "|" + p.name + ">" + f[1]
			l.cross[k] = map[int64]bool{}
			if len(f) > 2 {
				for _, st := range strings.Split(strings.TrimSuffix(f[2], ","), ",") {
					seq, _ := strconv.ParseInt(st, 10, 64)
					l.cross[k][seq] = true
				}
			}
		case "INC": // class from n
			n, _ := strconv.Atoi(f[3])
			l.incompat[f[1]+"|"+f[2]+">"+p.listen] += n
		case "COUNTS":
			for _, kv := range f[1:] {
				k, v, _ := strings.Cut(kv, "=")
				n, _ := strconv.Atoi(v)
				l.counts[k] += n
				if k == "flaps" && n > 0 {
					t.Errorf("%s lost a link %d times", p.name, n)
				}
			}
		}
	}
}

// tell reports, for one direction of one class, the messages neither
// received nor dead letters (but for kinds sent across versions), those
// received twice, those received and also dead letters that say they
// certainly were not, and the kinds sent across versions that are not
// dead letters (each must be an incompatible one at the receiver).
func (l *upLedger) tell(k string) (lost, twice, both []int64, crossed int64) {
	for seq := int64(1); seq <= l.sent[k]; seq++ {
		times := l.got[k][seq]
		reason, dead := l.dead[k][seq]
		switch {
		case times > 1:
			twice = append(twice, seq)
		case times == 1 && dead && !strings.HasSuffix(reason, "(unconfirmed)"):
			both = append(both, seq)
		case times == 0 && !dead && l.cross[k][seq]:
			crossed++
		case times == 0 && !dead:
			lost = append(lost, seq)
		}
	}
	return lost, twice, both, crossed
}

// group is the direction k ("class|incarnation>to") from its sender's
// address: the unit an incompatible dead letter is counted in.
func (l *upLedger) group(k string) string {
	class, rest, _ := strings.Cut(k, "|")
	from, to, _ := strings.Cut(rest, ">")
	return class + "|" + l.addrOf[from] + ">" + to
}

// unaccounted is, by group, how many messages sent are neither received
// nor dead letters nor across versions, how many kinds across versions
// are not dead letters, and how many dead letters are unconfirmed.
func (l *upLedger) unaccounted() (lost, crossed, unconfirmed map[string]int64) {
	lost, crossed, unconfirmed = map[string]int64{}, map[string]int64{}, map[string]int64{}
	for k := range l.sent {
		ls, _, _, c := l.tell(k)
		lost[l.group(k)] += int64(len(ls))
		crossed[l.group(k)] += c
		for _, r := range l.dead[k] {
			if strings.HasSuffix(r, "(unconfirmed)") {
				unconfirmed[l.group(k)]++
			}
		}
	}
	return lost, crossed, unconfirmed
}

// balanced reports whether every message sent is accounted for: received,
// a dead letter, or counted as incompatible by its receiver.
func (l *upLedger) balanced() bool {
	lost, crossed, _ := l.unaccounted()
	for g := range lost {
		if lost[g] > 0 || crossed[g] > int64(l.incompat[g]) {
			return false
		}
	}
	return true
}

// check: every message sent was received exactly once, with its fields as
// the rules say, or is a dead letter because its receiver was stopping;
// every kind crossing versions was refused as incompatible, and none
// within a version; nobody was given up on and no link was lost.
func (l *upLedger) check(t *testing.T) {
	t.Helper()
	var keys []string
	for k := range l.sent {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var total int64
	deadN, reasons, crossed := 0, map[string]int{}, 0
	for _, k := range keys {
		n := l.sent[k]
		total += n
		_, twice, both, _ := l.tell(k)
		if len(twice) > 0 || len(both) > 0 {
			t.Errorf("%s: %d sent, %d received twice, %d received and dead letters that say they were not", k, n, len(twice), len(both))
		}
		for seq, reason := range l.dead[k] {
			if l.got[k][seq] > 0 {
				continue
			}
			deadN++
			reasons[reason]++
			if !strings.Contains(reason, "peer_node_left") && !strings.Contains(reason, "actor_stopped") {
				t.Errorf("%s: message %d is a dead letter for a reason other than its receiver stopping: %s", k, seq, reason)
			}
		}
		if n == 0 && strings.HasPrefix(k, upMsg+"|") {
			t.Errorf("%s: nothing was sent", k)
		}
	}
	// Nothing is lost; every kind across versions that is not a dead
	// letter is one incompatible dead letter at its receiver, and no
	// message is incompatible otherwise.
	lost, crossedBy, unconfirmed := l.unaccounted()
	groups := map[string]bool{}
	for g := range lost {
		groups[g] = true
	}
	for g := range l.incompat {
		groups[g] = true
	}
	for g := range groups {
		ls, c, inc := lost[g], crossedBy[g], int64(l.incompat[g])
		crossed += int(inc)
		switch {
		case ls != 0:
			t.Errorf("%s: %d messages neither received nor dead letters: lost", g, ls)
		case strings.HasPrefix(g, upMsg+"|") && inc != 0:
			t.Errorf("%s: %d messages of a compatible change were incompatible", g, inc)
		case inc < c || inc > c+unconfirmed[g]:
			t.Errorf("%s: %d kinds sent across versions and not dead letters, but %d incompatible at the receiver", g, c, inc)
		}
	}
	c := l.counts
	t.Logf("%d messages in %d directions; %d incompatible; %d dead letters (a peer stopping: %v); counts %v", total, len(keys), crossed, deadN, reasons, c)
	if deadN > 50*l.restarts {
		t.Errorf("%d dead letters over %d restarts: more than a stopping receiver explains", deadN, l.restarts)
	}
	if crossed == 0 {
		t.Error("no kind crossed versions: the versions never overlapped")
	}
	for _, k := range []string{"disorder", "bad_fields", "lost"} {
		if c[k] != 0 {
			t.Errorf("%s: %d, want none", k, c[k])
		}
	}
}

// freeTCP returns a loopback address nothing listens on now.
func freeTCP(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "tcp://" + l.Addr().String()
}

// rollingUpgrade runs the service at addrs as v1, then replaces one
// incarnation at a time by v2 at the same address (a graceful stop, then
// a new process), under steady traffic between all of them, and checks
// the ledger.
func rollingUpgrade(t *testing.T, addrs []string, cluster bool) []*upProcess {
	others := func(i int) []string {
		var out []string
		for j, a := range addrs {
			if j != i {
				out = append(out, a)
			}
		}
		return out
	}
	seed := func(i int, first bool) string {
		switch {
		case !cluster:
			return ""
		case first && i == 0:
			return "self"
		case first:
			return addrs[0]
		}
		return addrs[(i+1)%len(addrs)] // (a live member)
	}
	procs := make([]*upProcess, len(addrs))
	for i, a := range addrs {
		procs[i] = startUpProcess(t, fmt.Sprintf("s%d-v1", i), a, seed(i, true), others(i), false)
	}
	ledger := newUpLedger()
	settle := func() {
		// Let traffic flow both ways between every pair: each process
		// has received at least 100 messages from every other one now
		// running.
		deadline := time.Now().Add(30 * time.Second)
		for {
			ok := true
			for _, p := range procs {
				got := map[string]int{}
				for _, l := range p.ask(t, "counts", "END") {
					if f := strings.Fields(l); len(f) == 3 {
						got[f[1]], _ = strconv.Atoi(f[2])
					}
				}
				for _, q := range procs {
					ok = ok && (q == p || got[q.name] >= 100)
				}
			}
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("no traffic between every pair within 30s")
			}
			time.Sleep(50 * time.Millisecond) // (traffic in other processes: polled)
		}
	}
	settle()
	for i, a := range addrs {
		ledger.add(t, procs[i], procs[i].ask(t, "stop", "STOPPED"))
		ledger.restarts++
		procs[i] = startUpProcess(t, fmt.Sprintf("s%d-v2", i), a, seed(i, false), others(i), true)
		settle()
	}
	for _, p := range procs {
		p.ask(t, "quiesce", "QUIESCED")
	}
	// The last messages are in flight: wait until the ledger balances.
	var final *upLedger
	deadline := time.Now().Add(20 * time.Second)
	for {
		final = ledger.clone()
		for _, p := range procs {
			final.add(t, p, p.ask(t, "report", "END"))
		}
		if final.balanced() || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // (in-flight messages arriving in other processes: polled)
	}
	final.check(t)
	return procs
}

// A rolling upgrade of a three-member cluster: v1 on every member, then
// one member at a time stopped gracefully and started again as v2 at the
// same address, under steady traffic between all members. Every message
// of the type that changed as the rules allow is received exactly once,
// in order, or is a dead letter (while its receiver restarts); every
// message of the type whose field changed kind is refused as
// incompatible exactly between the two versions; nobody is lost or
// quarantined, no link flaps more than a few times, and the cluster ends
// converged with every member up at v2.
func TestARollingUpgradeOfACluster(t *testing.T) {
	longRun(t)
	addrs := []string{freeTCP(t), freeTCP(t), freeTCP(t)}
	procs := rollingUpgrade(t, addrs, true)
	waitUntil(t, 30*time.Second, "the cluster converged at v2", func() bool {
		for _, p := range procs {
			up := 0
			for _, l := range p.ask(t, "members", "END") {
				f := strings.Fields(l)
				switch {
				case f[0] == "QUARANTINED" && f[1] != "0":
					t.Fatalf("%s quarantined a peer", p.name)
				case f[0] == "MEMBER" && f[2] == "up" && f[3] == "v2" && f[4] == "true":
					up++
				case f[0] == "MEMBER" && f[2] != "removed":
					return false
				}
			}
			if up != len(procs) {
				return false
			}
		}
		return true
	})
}

// The same for two plain nodes (no cluster), over TCP.
func TestARollingUpgradeOfTwoNodesOverTCP(t *testing.T) {
	t.Parallel()
	slowTest(t)
	rollingUpgrade(t, []string{freeTCP(t), freeTCP(t)}, false)
}

// The same for two plain nodes over Unix sockets.
func TestARollingUpgradeOfTwoNodesOverUnixSockets(t *testing.T) {
	t.Parallel()
	slowTest(t)
	dir, err := os.MkdirTemp("", "up")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	rollingUpgrade(t, []string{"unix://" + dir + "/a.sock", "unix://" + dir + "/b.sock"}, false)
}
