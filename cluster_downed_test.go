package troupe

import (
	"bytes"
	"fmt"
	"net"
	"testing"
	"time"
)

// A hello's downed notice (extension 6) downs the member it names, when
// it comes from a member whose word counts and, with a secret, carries
// the dialer's proof; it is acted on before the handshake's challenge,
// which a dialer that cannot hear the member never answers. One naming
// another incarnation, from a stranger, or with a wrong proof, does
// nothing. The dialer here is a raw connection that reads one answer, so
// the notice has been handled when the test looks.
func TestADownedNoticeInAHelloDownsTheMemberItNames(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	secret := bytes.Repeat([]byte{0x42}, 32)
	start := func(t *testing.T, name string, secret []byte) (*Node, *Node, *Cluster, *Cluster) {
		cfgA, cfgB := testConfig("tcp://127.0.0.1:0"), testConfig("tcp://127.0.0.1:0")
		cfgA.Name, cfgB.Name = name+"-a", name+"-b"
		cfgA.Secret, cfgB.Secret = secret, secret
		a, b := startNode(t, cfgA), startNode(t, cfgB)
		ca, err := StartCluster(ctxT(t, 5*time.Second), a, clusterCfg(nil))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ca.Close() })
		cfg := clusterCfg(nil)
		cfg.Seeds = []string{a.Addrs()[0].String()}
		cb, err := StartCluster(ctxT(t, 5*time.Second), b, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cb.Close() })
		waitFor(t, 10*time.Second, "both members up on both", func() bool {
			return memberStatus(ca, b.UID()) == MemberUp && memberStatus(cb, a.UID()) == MemberUp
		})
		return a, b, ca, cb
	}
	tell := func(t *testing.T, to *Node, by NodeUID, d downedNotice) {
		t.Helper()
		c, err := net.Dial("tcp", to.Addrs()[0].address)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		h := &hello{version: protocolVersion, flags: helloProbe, uid: by, name: "teller", auth: newNonce(), downed: &d}
		if _, err := c.Write(appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameHello, h) })); err != nil {
			t.Fatal(err)
		}
		if _, err := newFrameReader(c, maxHelloSize).next(); err != nil { // a challenge, a welcome or a refusal
			t.Fatalf("no answer to the hello: %v", err)
		}
	}
	stillUp := func(t *testing.T, c *Cluster, after string) {
		t.Helper()
		if s := c.Self().Status; s != MemberUp {
			t.Fatalf("after %s, the member is %v, want up", after, s)
		}
	}

	t.Run("with a secret", func(t *testing.T) {
		t.Parallel()
		a, b, ca, _ := start(t, "secret", secret)
		tell(t, a, b.UID(), downedNotice{uid: a.UID()})
		stillUp(t, ca, "a notice without a proof")
		tell(t, a, b.UID(), downedNotice{uid: a.UID(), mac: downedMAC(bytes.Repeat([]byte{0x43}, 32), b.UID(), a.UID())})
		stillUp(t, ca, "a notice proven with another secret")
		tell(t, a, b.UID(), downedNotice{uid: b.UID(), mac: downedMAC(secret, b.UID(), b.UID())})
		stillUp(t, ca, "a notice naming another uid")
		tell(t, a, a.UID(), downedNotice{uid: a.UID(), mac: downedMAC(secret, a.UID(), a.UID())})
		stillUp(t, ca, "a proven notice claiming to come from the member itself")
		stranger := NodeUID{0x77}
		tell(t, a, stranger, downedNotice{uid: a.UID(), mac: downedMAC(secret, stranger, a.UID())})
		stillUp(t, ca, "a proven notice from a node that is no member")
		tell(t, a, b.UID(), downedNotice{uid: a.UID(), mac: downedMAC(secret, b.UID(), a.UID())})
		waitFor(t, 5*time.Second, "the member told it is down to down itself", func() bool { return ca.Self().Status >= MemberDown })
	})
	t.Run("without a secret", func(t *testing.T) {
		t.Parallel()
		a, b, ca, cb := start(t, "plain", nil)
		tell(t, a, NodeUID{0x77}, downedNotice{uid: a.UID()})
		stillUp(t, ca, "a notice from a node that is no member")
		// The node's own way of telling: a probe from b's node.
		b.peers.tellDowned(a.Addrs()[0], a.UID())
		waitFor(t, 5*time.Second, "the member told it is down to down itself", func() bool { return ca.Self().Status >= MemberDown })
		stillUp(t, cb, "telling another member it is down")
	})
}

// The leader's record of the members it downed: a member seen down is
// told about every second, early by up to half a turn; one whose probe
// was answered is told no more; one whose dial failed is tried again
// later and later, up to maxDownedBackoff; one seen removed only (it may
// have left) is never told; one whose address a live member holds now is
// not told; at most maxDownedNotices go at once; entries go after keep.
func TestDownedMembersAreToldAtTheirPace(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_000_000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	free := func(Addr) bool { return false }
	var d downedMembers
	x, y, gone := NodeUID{1}, NodeUID{2}, NodeUID{3}
	d.note(Member{UID: x, Addr: tcpAddr("10.0.0.1:7000"), Status: MemberDown}, t0, time.Minute)
	d.note(Member{UID: y, Addr: tcpAddr("10.0.0.2:7000"), Status: MemberDown}, t0, time.Minute)
	d.note(Member{UID: gone, Addr: tcpAddr("10.0.0.3:7000"), Status: MemberRemoved}, t0, time.Minute)
	uids := func(ts []downedTarget) map[NodeUID]bool {
		m := map[NodeUID]bool{}
		for _, t := range ts {
			m[t.uid] = true
		}
		return m
	}
	steps := []struct {
		name string
		now  time.Duration
		want []NodeUID
		then func(now time.Time)
	}{
		{"both seen down are due at once, the removed one never", 0, []NodeUID{x, y}, func(now time.Time) {
			d.done(x, now, false, true)  // dialed, no answer: every second
			d.done(y, now, false, false) // no dial: a second, then 2, 4...
		}},
		{"half a turn early is on time", 950 * time.Millisecond, []NodeUID{x, y}, func(now time.Time) {
			d.done(x, now, false, true)
			d.done(y, now, false, false)
		}},
		{"x again a second later; y waits two", 2 * time.Second, []NodeUID{x}, func(now time.Time) {
			d.done(x, now, true, true) // answered: told
		}},
		{"y after two seconds; x, told, never again", 3 * time.Second, []NodeUID{y}, func(now time.Time) {
			d.done(y, now, false, false)
		}},
		{"y not before four seconds more", 6 * time.Second, nil, nil},
		{"y four seconds on", 7 * time.Second, []NodeUID{y}, func(now time.Time) {
			for range 10 {
				d.done(y, now, false, false) // (as if ten dials had failed)
				d.at[y].busy = true
				d.inFlight.Add(1)
			}
			d.done(y, now, false, false)
		}},
		{"the backoff is bounded", 7*time.Second + maxDownedBackoff, []NodeUID{y}, nil},
		{"forgotten after keep", 2 * time.Minute, nil, nil},
	}
	for _, st := range steps {
		got := uids(d.due(at(st.now), 100*time.Millisecond, free))
		if len(got) != len(st.want) {
			t.Fatalf("%s: due %v, want %v", st.name, got, st.want)
		}
		for _, u := range st.want {
			if !got[u] {
				t.Fatalf("%s: due %v, want %v", st.name, got, st.want)
			}
		}
		if st.then != nil {
			st.then(at(st.now))
		}
	}
	if len(d.times()) != 0 {
		t.Fatalf("entries left after keep: %v", d.times())
	}

	// A later incarnation at the address; the bound on notices in flight.
	var e downedMembers
	e.note(Member{UID: x, Addr: tcpAddr("10.0.0.1:7000"), Status: MemberDown}, t0, time.Minute)
	if got := e.due(t0, 0, func(a Addr) bool { return a == tcpAddr("10.0.0.1:7000") }); len(got) != 0 || !e.at[x].told {
		t.Fatalf("a member whose address a live member holds is due: %v", got)
	}
	var f downedMembers
	for i := range 2 * maxDownedNotices {
		f.note(Member{UID: NodeUID{byte(i + 1)}, Addr: tcpAddr(fmt.Sprintf("10.0.1.%d:7000", i)), Status: MemberDown}, t0, time.Minute)
	}
	if got := f.due(t0, 0, free); len(got) != maxDownedNotices {
		t.Fatalf("%d notices at once, want %d", len(got), maxDownedNotices)
	}
	if got := f.due(t0, 0, free); len(got) != 0 {
		t.Fatalf("%d more notices while %d are in flight", len(got), maxDownedNotices)
	}
}
