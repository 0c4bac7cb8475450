package troupe

import (
	"crypto/hmac"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"
	"time"
)

// The handshake of a new connection, in both directions, and the rule that
// keeps one association per pair of nodes when both dial at once.

// peerInfo is what a connection's handshake learned of the peer and agreed
// with it. The handshake fills it in (the dialer's nonce and dial number
// before the hello, the rest from the peer's hello or welcome) and attach
// stores it in the association whole, under the association's lock, before
// the association is up; from then on it is read-only.
type peerInfo struct {
	uid        NodeUID
	name       string
	appVersion string // the peer's Config.AppVersion
	flags      uint8  // the peer's hello flags
	addrs      []Addr // as the peer announced them: claims, not proof
	// resumable: both sides sequence every queued frame, and a broken
	// connection suspends the session instead of ending it.
	resumable bool
	// observer: the peer is an Observer (Config.Observer): it is not
	// listed, published, resumed or quarantined.
	observer bool
	// headers: the peer takes tells with headers; another gets messages
	// without their headers.
	headers bool
	// credit: both sides grant and heed per-actor credit.
	credit bool
	// Session tokens (token.go). tokens: the peer speaks them. nonce: the
	// dialer's nonce in this connection's hello. challenged: the nonce of
	// the token challenge this node sent as the acceptor, if it sent one.
	// proof: the peer's proof of its claim (the acceptor's, from its
	// welcome; the dialer's, answering the challenge).
	tokens                   bool
	nonce, challenged, proof []byte
	// dialNum is the number of the dial that made this connection (hello
	// extension 5): this node's for an outbound one, the peer's for an
	// inbound one; 0 when the peer does not order dials by them.
	dialNum uint64
	rtt     time.Duration // the handshake's round trip (outbound)
}

// opening is what a connection's writer sends first, decided before the
// writer starts: sendToken by attach (under the peer table's lock),
// resume and resumeRcv by takeOver (under both sessions' locks).
type opening struct {
	// sendToken: this node's session token goes first (the connection
	// founds the session, or its peer proved it: token.go).
	sendToken bool
	// resume: the connection resumes a session, and its first frame is a
	// resume saying that this side received resumeRcv frames.
	resume    bool
	resumeRcv uint64
}

// runOutbound dials for a, handshakes and then runs a's reader.
func (g *gate) runOutbound(a *assoc) {
	n := g.n
	n.peers.mu.Lock()
	if _, live := n.peers.all[a]; a.tab.binding && !live {
		// Forgotten (the node closed, or no ref held it): nothing dials.
		n.peers.mu.Unlock()
		a.fail(fmt.Errorf("%s: the binding of a ref was forgotten: %w", a.dialAddr, ErrNodeClosed))
		return
	}
	if _, live := n.peers.all[a]; a.tab.binding && live {
		// First use of a ref's binding: from now on it is a dial (one
		// refused stays a binding, and ends as one).
		err := n.peers.chargeRefDial(a)
		if n.peers.outbound >= n.cfg.MaxOutboundConns {
			err = fmt.Errorf("%s: %w: %d outbound associations (Config.MaxOutboundConns)", a.dialAddr, ErrTooManyConns, n.peers.outbound)
		}
		if err != nil {
			// No dial of this node's own may find this binding from now on.
			if n.peers.byAddr[a.dialAddr] == a {
				delete(n.peers.byAddr, a.dialAddr)
			}
			n.peers.mu.Unlock()
			a.fail(err)
			return
		}
		n.peers.bindings--
		a.tab.binding = false
		n.peers.outbound++
	}
	n.peers.mu.Unlock()
	c, err := a.n.peers.dial(a.dialAddr)
	if err != nil {
		a.fail(err)
		return
	}
	g.runDialed(a, c)
}

// runDialed handshakes over c, which a dialed, and then runs the reader.
func (g *gate) runDialed(a *assoc, c net.Conn) {
	if fr := g.handshakeDialed(a, c); fr != nil {
		a.run(fr) // with the handshake's frame off the stack the reader idles on
	}
}

// handshakeDialed handshakes over c, which a dialed: the frame reader of
// an association that is up, or nil.
func (g *gate) handshakeDialed(a *assoc, c net.Conn) *frameReader {
	n := g.n
	a.mu.Lock()
	merged := a.life.state == assocClosed
	if !merged {
		a.conn = c
	}
	a.mu.Unlock()
	if merged {
		c.Close()
		return nil
	}
	c.SetDeadline(time.Now().Add(n.cfg.HandshakeTimeout))
	a.in = &stampReader{c: c, epoch: n.epoch}
	fr := newFrameReader(a.in, n.cfg.MaxFrameSize)
	sentHello := time.Now()
	h := n.gate.hello()
	if a.resumeOf != nil {
		h.flags |= helloResuming
	}
	var p peerInfo // what the handshake learns of the peer, for attach
	if !n.cfg.priorRelease {
		p.nonce = newNonce()
		h.session = p.nonce
		p.dialNum = n.ids.dial.Add(1)
		h.dial = p.dialNum
	}
	body, trips, err := n.gate.dialHandshake(c, fr, h)
	if at := a.in.heard.Load(); err == nil && at != 0 {
		// The verdict came back one round trip after the hello, or more
		// with a secret or a token challenge (each a challenge, then a
		// proof): an estimate for Stats.
		p.rtt = max(0, n.epoch.Add(time.Duration(at)).Sub(sentHello)/time.Duration(trips))
	}
	if err != nil {
		a.fail(fmt.Errorf("handshake: %w", err))
		return nil
	}
	switch frameKind(body[0]) {
	case frameWelcome:
	case frameReject:
		r, perr := parseReject(body[1:])
		if r.code == rejectDuplicate && perr == nil {
			c.Close()
			n.gate.awaitWinner(a, r.uid)
			return nil
		}
		if r.code == rejectQuarantined {
			q := n.peers.quarantineFor(r.uid)
			if q != nil && perr == nil {
				// Each side gave up on the other (a partition): the answer
				// is this node's quarantine as much as the peer's.
				a.fail(fmt.Errorf("%w: %w since %s (%v), and %w: %s", ErrRejected, ErrQuarantined, q.Since.Format(time.RFC3339), q.Cause, ErrQuarantinedByPeer, r.text))
			} else {
				a.fail(fmt.Errorf("%w: %w: %s", ErrRejected, ErrQuarantinedByPeer, r.text))
			}
			if f := n.cl.quarantinedBy.Load(); f != nil && perr == nil {
				(*f)(r.uid)
			}
			return nil
		}
		if r.code == rejectAuth {
			a.fail(fmt.Errorf("%w: %w: %s", ErrRejected, ErrAuth, r.text))
			return nil
		}
		if r.code == rejectVersion {
			a.fail(fmt.Errorf("%w: the peer speaks another wire protocol version than this node's %d (it said: %s)", ErrRejected, ProtocolVersion, r.text))
			return nil
		}
		a.fail(fmt.Errorf("%w: %s", ErrRejected, r.text))
		return nil
	default:
		a.fail(&frameError{Peer: a.dialAddr.String(), Kind: frameKind(body[0]).String(), Reason: fmt.Errorf("%w: expected a welcome", ErrMalformed)})
		return nil
	}
	w, err := parseHello(body[1:])
	if err != nil {
		a.fail(&frameError{Peer: a.dialAddr.String(), Kind: "welcome", Reason: err})
		return nil
	}
	h = w
	c.SetDeadline(time.Time{})
	if !n.gate.attach(a, h, p) {
		return nil
	}
	return fr
}

// gate admits peers into the node's peer table: it runs the handshake
// of each connection, checks its proofs (the secret, a session's
// token) and decides whether the connection attaches, merges, resumes
// or is refused. Its methods run on the connection's goroutine; the
// decision takes the peer table's lock, and the tokens have a lock of
// their own.
type gate struct {
	n *Node
	// tokens are the session tokens this node drew for its peers
	// (token.go).
	tokens tokenTable
}

// serveInbound handshakes an accepted connection and then runs its reader.
func (g *gate) serveInbound(c net.Conn, src string) {
	if a, fr := g.handshakeInbound(c, src); a != nil {
		a.run(fr) // with the handshake's frame off the stack the reader idles on
	}
}

// handshakeInbound handshakes an accepted connection: the association
// that reads it from now on, or nil.
func (g *gate) handshakeInbound(c net.Conn, src string) (*assoc, *frameReader) {
	if !g.n.inbound.begin(c) {
		c.Close()
		g.n.inbound.handshakeDone(c, src)
		return nil, nil
	}
	handshaking := true
	endHandshake := func() { g.n.inbound.handshakeDone(c, src) }
	defer func() {
		if handshaking {
			endHandshake()
		}
	}()
	label := peerLabel(c)
	c.SetDeadline(time.Now().Add(g.n.cfg.HandshakeTimeout))
	if err := checkPeerCred(c, g.allowPeerUID); err != nil {
		// The dialer wraps the text in its own ErrRejected and ErrAuth.
		c.Write(rejectFrame(rejectAuth, g.n.uid, strings.TrimPrefix(err.Error(), ErrRejected.Error()+": ")))
		c.Close()
		return nil, nil
	}
	in := &stampReader{c: c, epoch: g.n.epoch}
	fr := newFrameReader(in, g.n.cfg.MaxFrameSize)
	body, err := fr.hello()
	var h *hello
	if err == nil {
		h, err = parseHello(body[1:])
	}
	if err != nil {
		if h != nil && h.version != protocolVersion {
			c.Write(rejectFrame(rejectVersion, g.n.uid, err.Error()))
		}
		c.Close()
		if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !errors.Is(err, syscall.ECONNRESET) {
			g.protocolError(label, "hello", err)
		}
		return nil, nil
	}
	if h.downed != nil {
		g.heardDowned(h, label) // (before the challenge: the dialer may never hear it)
	}
	if err := g.acceptAuth(c, fr, h); err != nil {
		g.n.log.Warn("troupe: refused a peer that failed authentication", "peer", label, "claimed_name", h.name, "err", err)
		// The dialer wraps the text in its own ErrAuth.
		c.Write(rejectFrame(rejectAuth, g.n.uid, strings.TrimPrefix(err.Error(), ErrAuth.Error()+": ")))
		c.Close()
		g.n.totals.authRefused.Add(1)
		g.n.events.emit(ProtocolError{Remote: label, Err: err})
		return nil, nil
	}
	if h.flags&helloProbe != 0 {
		// A registry probe: answer who we are, and forget it.
		c.Write(appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameWelcome, g.hello()) }))
		c.Close()
		return nil, nil
	}
	if g.n.cfg.priorRelease {
		h.session, h.dial, h.ordered = nil, 0, false // (a node of an earlier release skips the tags)
	}
	a := newAssoc(g.n, false, Addr{})
	a.conn, a.in = c, in
	p := peerInfo{nonce: h.session} // what the handshake learns of the peer, for attach
	if h.session != nil && g.holdsSession(h.uid) {
		// The hello claims a session this node holds: the dialer proves
		// it holds its token (checked by attach, against the session it
		// would take over).
		var err error
		if p.challenged, p.proof, err = g.challengeToken(c, fr, h); err != nil {
			c.Close()
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !errors.Is(err, syscall.ECONNRESET) {
				g.protocolError(label, "proof", err)
			}
			return nil, nil
		}
	}
	if h.flags&helloResuming != 0 && g.mayTakeOver(&p, h.uid) {
		// Only once the dialer has authenticated, and proven that it
		// holds the session's token: a stranger must not be able to break
		// a live session by claiming its peer's uid.
		g.suspendFor(h.uid)
	}
	g.n.peers.mu.Lock()
	g.n.peers.all[a] = struct{}{}
	g.n.peers.mu.Unlock()
	if !g.attach(a, h, p) {
		return nil, nil
	}
	handshaking = false
	endHandshake()
	c.SetDeadline(time.Time{})
	if a.mergedTo.Load() != nil {
		// It lost to a duplicate as it attached, and retires: its drain
		// is bounded as mergeInto set it.
		c.SetReadDeadline(time.Now().Add(retireDrain))
	}
	return a, fr
}

// heardDowned acts on a hello's downed notice (extension 6): the dialer
// says its cluster downed this node's incarnation. A member whose
// traffic to the others is lost (a one-way partition) can still hear
// them, but no handshake with them completes, so no gossip tells it; the
// notice does, in the hello itself, which needs no answer. With a
// secret, the notice carries its own proof (downedMAC), since the
// challenge that authenticates a connection needs an answer the dialer
// may never hear; one without a valid proof is ignored. The cluster, if
// one runs, decides whether the dialer is a member whose word counts.
func (g *gate) heardDowned(h *hello, label string) {
	if h.downed.uid != g.n.uid {
		return // (an earlier incarnation's, at this address)
	}
	if s := g.n.cfg.Secret; s != nil && !hmac.Equal(h.downed.mac, downedMAC(s, h.uid, h.downed.uid)) {
		g.n.log.Warn("troupe: ignored a notice that this node was downed: it failed authentication", "peer", label, "claimed_uid", h.uid.String())
		return
	}
	if f := g.n.cl.downedBy.Load(); f != nil {
		(*f)(h.uid)
	}
}

// rejectFrame is the whole frame that refuses a dialer.
func rejectFrame(code byte, uid NodeUID, text string) []byte {
	return appendWhole(nil, appendReject(nil, rejectBody{code: code, uid: uid, text: text}))
}

func (g *gate) hello() *hello {
	h := &hello{version: protocolVersion, uid: g.n.uid, name: g.n.name, flags: helloResumable | helloCredit | helloDrains | helloShapes, appVersion: g.n.cfg.AppVersion, headers: true}
	if g.n.cfg.Observer {
		// An observer's session ends with its connection: nothing to
		// resume.
		h.flags &^= helloResumable
		h.observer = true
	}
	if g.n.registrar.reg() != nil {
		h.flags |= helloRegistrar
		if g.n.cfg.EnsureRegistry {
			h.flags |= helloDedicated
		}
	}
	for _, a := range g.n.addrList() {
		h.addrs = append(h.addrs, a.String())
	}
	return h
}

func (g *gate) protocolError(remote, kind string, err error) {
	fe := &frameError{Peer: remote, Kind: kind, Reason: err}
	g.n.log.Warn("troupe: closing connection after a protocol error", "peer", remote, "err", err)
	g.n.totals.protocolErrors.Add(1)
	g.n.events.emit(ProtocolError{Remote: remote, Err: fe})
}

// attach is attachConn between the calls of a test's attach hook, if it
// set one (Config.attachHook).
func (g *gate) attach(a *assoc, h *hello, p peerInfo) bool {
	if hook := g.n.cfg.attachHook; hook != nil {
		hook(a, h.uid, false)
		defer hook(a, h.uid, true)
	}
	return g.attachConn(a, h, p)
}

// attachConn decides whether a connection whose handshake just completed
// becomes the association with that peer. When both nodes dial each other
// at once, the connection dialed by the node with the lower uid wins on
// both sides; the loser is merged into the winner. For an inbound
// connection attach also sends the welcome or the rejection. It returns
// whether the caller should run the connection.
func (g *gate) attachConn(a *assoc, h *hello, p peerInfo) bool {
	a.mu.Lock()
	merged := a.life.state == assocClosed
	a.mu.Unlock()
	if merged {
		// Merged into the peer's own connection while this one was in its
		// handshake.
		a.conn.Close()
		return false
	}
	g.learn(&p, a.outbound, h)
	if !g.answersResume(a, h, &p) {
		return false
	}
	// Under mu: senders that queue to a (before it is up) read it.
	a.mu.Lock()
	a.peer = p
	a.mu.Unlock()
	g.n.peers.mu.Lock()
	d := g.decideAttach(a, h)
	loser, winner, replaced, resume := d.loser, d.winner, d.replaced, d.resume
	if d.reject != accept {
		g.refuse(a, h, d) // (it unlocks peers.mu)
		return false
	}
	prev := g.tokenFor(h.uid) // (before a session this connection founds draws a new one)
	g.sessionTokens(a, d)
	// The welcome is written once the peer table is unlocked: a slow
	// write must not hold up the heartbeat loop or other handshakes. No
	// other frame can go first: the writer starts after attach returns.
	var welcome []byte
	if !a.outbound {
		w := g.hello()
		if resume {
			w.flags |= helloResuming
		}
		if a.peer.tokens {
			w.session = g.sessionProof(h.uid, a.peer.nonce, d.founds, prev)
		}
		w.ordered = !g.n.cfg.priorRelease
		welcome = appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameWelcome, w) })
	}
	a.mu.Lock()
	a.stepLocked(lifeEvent{kind: evHandshaken, at: time.Now()}, &taken{}) // (no effects)
	a.firstFrames(resume)
	a.mu.Unlock()
	a.hb.start(time.Now())
	if loser == a {
		// This connection lost to one that is already up: retire it
		// (the peer is told, and both ends drain it).
		g.n.peers.mu.Unlock()
		writeWelcome(a.conn, welcome)
		a.mergeInto(winner)
		return true
	}
	g.n.peers.byUID[h.uid] = a
	// Routing by address uses only what is proven: the address this node
	// dialed and found this uid at. A peer's announced addresses are
	// claims; a send to one of them dials it, and the handshake proves
	// (or not) that the same node answers there.
	if a.outbound {
		g.n.peers.byAddr[a.dialAddr] = a
		a.tab.proven = append(a.tab.proven, a.dialAddr)
	}
	waiting := g.n.peers.awaiting[h.uid]
	delete(g.n.peers.awaiting, h.uid)
	a.closeReady()
	g.n.peers.mu.Unlock()
	writeWelcome(a.conn, welcome)

	if replaced != nil {
		replaced.fail(fmt.Errorf("%w: %s connected again without resuming", errSessionReplaced, a.label()))
	}
	for _, w := range waiting {
		w.mergeInto(a)
	}
	if loser != nil {
		loser.mergeInto(a)
	}
	if !resume && a.resumeOf == nil && !a.peer.observer {
		g.n.totals.peersConnected.Add(1)
		g.n.events.emit(PeerConnected{Addr: a.addr(), UID: a.peer.uid, Name: a.peer.name})
	}
	if !a.outbound {
		g.n.peers.proveClaims(a)
	}
	return true
}

// learn completes p, what the handshake of a connection (outbound or
// not) learned of the peer, from the peer's hello h (its welcome, for an
// outbound connection).
func (g *gate) learn(p *peerInfo, outbound bool, h *hello) {
	p.tokens = h.session != nil && !g.n.cfg.priorRelease
	if outbound && !g.n.cfg.priorRelease {
		p.proof = h.session // the acceptor's proof of its session token
	}
	switch {
	case !outbound:
		p.dialNum = h.dial
	case !h.ordered:
		p.dialNum = 0 // the peer orders this node's dials as they come
	}
	p.uid, p.name, p.flags, p.appVersion = h.uid, h.name, h.flags, h.appVersion
	p.resumable = h.flags&helloResumable != 0 && !h.observer && !g.n.cfg.Observer
	p.observer = h.observer
	p.headers = h.headers
	p.credit = h.flags&helloCredit != 0
	for _, s := range h.addrs {
		if ad, err := ParseAddr(s); err == nil {
			p.addrs = append(p.addrs, ad)
		}
	}
}

// answersResume checks who answered a connection that was to resume a
// suspended session (a.resumeOf): the same incarnation must prove the
// session's token; another incarnation, or one that no longer holds the
// session, ends it. False if the connection is refused.
func (g *gate) answersResume(a *assoc, h *hello, p *peerInfo) bool {
	if r := a.resumeOf; r != nil && h.uid == r.peer.uid && h.flags&helloResuming != 0 {
		// (A welcome that does not resume says the peer no longer holds
		// the session: below.)
		r.mu.Lock()
		token := r.peerToken
		r.mu.Unlock()
		if token != nil && !g.provesSession(a.outbound, p, h.uid, token) {
			// Another answers with the uid of the peer whose session
			// this connection was to resume: the session is not its to
			// take, nor to end.
			why := fmt.Sprintf("%s answers with the uid of the peer whose session this node resumes, without proving that it holds the session's token", a.dialAddr)
			g.n.log.Warn("troupe: refused a connection that claims another's session", "peer", a.label(), "claimed_uid", h.uid.String(), "claimed_name", h.name)
			g.n.totals.authRefused.Add(1)
			g.n.events.emit(ProtocolError{Remote: a.label(), Err: fmt.Errorf("%w: %s", ErrAuth, why)})
			sayBye(a.conn, byeRefused, why)
			a.fail(fmt.Errorf("%w: %s", ErrAuth, why))
			return false
		}
	}
	if r := a.resumeOf; r != nil && (h.uid != r.peer.uid || h.flags&helloResuming == 0) {
		// The incarnation the suspended session was with is gone (another
		// answers), or it no longer holds the session: it ended there.
		why := "another incarnation answers at " + a.dialAddr.String()
		if h.uid == r.peer.uid {
			why = "the peer no longer holds the session"
		}
		r.mu.Lock()
		cause := r.life.lostCause
		r.mu.Unlock()
		r.fail(fmt.Errorf("%v, and %s", cause, why))
		if h.uid == r.peer.uid {
			// The peer holds an accepted session for this connection:
			// it must not wait for it to come back.
			sayBye(a.conn, byeRefused, why)
			a.fail(errors.New(why))
			return false
		}
		a.resumeOf = nil // a new peer at the address: a new association
	}
	return true
}

// sayBye writes a goodbye on a connection that no reader or writer uses
// yet, within byeGrace.
func sayBye(c net.Conn, code byte, text string) {
	if len(text) > maxByeText {
		text = text[:maxByeText]
	}
	c.SetWriteDeadline(time.Now().Add(byeGrace))
	c.Write(appendWhole(nil, appendBye(nil, code, text)))
}

// accept is no reject code: the connection is accepted.
const accept = 255

// admission is what attach decides for a connection whose handshake
// completed: a refusal (reject, text), or which association stays when
// there is another with the same peer (loser merges into winner), whether
// the connection resumes a suspended session, or replaces one the peer no
// longer holds.
type admission struct {
	reject        byte
	text          string
	loser, winner *assoc
	replaced      *assoc
	resume        bool
	// quarantined: the entry that refused the peer.
	quarantined *quarantineInfo
	// impostor: the connection offered a wrong proof of the session's
	// token (see token.go).
	impostor bool
	// founds: the connection begins a session (there was none, or it
	// replaces one); proven: it proved the token of the session it joins.
	founds, proven bool
}

// refuseClaim refuses a, which claims a session this node holds without
// proving that it holds the session's token. A dialer that offered no
// proof is told that the other connection wins: it may be the peer
// itself, whose hello crossed the session coming up (there was nothing
// to challenge yet), and it then goes on with the session that holds.
func (g *gate) refuseClaim(a *assoc, d *admission) {
	switch {
	case a.outbound:
		d.reject, d.text, d.impostor = rejectAuth, fmt.Sprintf("%s answers with the uid of a peer this node holds a session with, without proving that it holds the session's token", a.dialAddr), true
	case a.peer.proof == nil:
		d.reject, d.text = rejectDuplicate, "the other connection between these nodes wins (this one did not prove that it holds the session's token)"
	default:
		d.reject, d.text, d.impostor = rejectAuth, "this connection claims a session it could not prove it holds (a wrong session token)", true
	}
}

// decideAttach decides what becomes of a, whose peer said h (peers.mu held).
func (g *gate) decideAttach(a *assoc, h *hello) admission {
	d := admission{reject: accept}
	// (Looked up once: the quarantine has its own lock, and a clear may
	// come between two looks.)
	q := g.n.peers.quarantineFor(h.uid)
	switch {
	case g.n.peers.closing:
		d.reject, d.text = rejectClosing, "node is closing"
	case h.uid == g.n.uid:
		d.reject, d.text = rejectOther, "a node cannot associate with itself"
	case q != nil:
		// A quarantine binds the incarnation (its uid), not its addresses:
		// a process started again at the same address is a new peer,
		// whose actors are new, and is admitted.
		d.reject, d.text = rejectQuarantined, fmt.Sprintf("%s quarantined you at %s (%v); it must call ClearQuarantine first", g.n.name, q.Since.Format(time.RFC3339), q.Cause)
		d.quarantined = q
	default:
		// Only the uid decides which connection is a duplicate: the
		// addresses a peer announces are claims, not proof.
		ex := g.n.peers.byUID[h.uid]
		if ex == nil || ex == a {
			d.founds = true
			break
		}
		{
			ex.mu.Lock()
			suspended := ex.life.state == assocSuspended
			token := ex.peerToken
			ex.mu.Unlock()
			if token != nil && g.provesNoSession(a.outbound, &a.peer, h.uid, token) {
				// The acceptor proved that it holds no session with this
				// node: the one held here ended there. A suspended one is
				// replaced; a live one stays until it is judged. (A
				// welcome without that proof, the zero one among them,
				// is a claim like any other: below.)
				if suspended {
					d.replaced, d.founds = ex, true
				} else {
					d.reject, d.text = rejectDuplicate, "the peer holds no session with this node, and the one this node holds is still connected"
				}
				break
			}
			// A connection that would take the session over must prove
			// it holds the session's token (token.go); one that offers a
			// wrong proof is refused whatever it would have become.
			d.proven = token != nil && g.provesSession(a.outbound, &a.peer, h.uid, token)
			unproven := token != nil && !d.proven
			if unproven && a.peer.proof != nil {
				g.refuseClaim(a, &d)
				break
			}
			if suspended && a.peer.resumable && (a.resumeOf == ex || !a.outbound && h.flags&helloResuming != 0) {
				if unproven {
					g.refuseClaim(a, &d)
					break
				}
				d.loser, d.winner, d.resume = ex, a, true
				a.tab.resumes = ex
				break
			}
			if suspended && !a.outbound && h.flags&helloResuming == 0 {
				// The same incarnation dialed without resuming: it no
				// longer holds the session (it gave up on it). The new
				// connection is the association from now on.
				if unproven {
					g.refuseClaim(a, &d)
					break
				}
				d.replaced, d.founds = ex, true
				break
			}
			switch chooseDuplicate(dialOf{a.outbound, a.peer.dialNum}, dialOf{ex.outbound, ex.peer.dialNum}, g.n.uid, h.uid) {
			case keepFresh:
				if unproven {
					g.refuseClaim(a, &d)
					break
				}
				d.loser, d.winner = ex, a
			case keepHeld:
				if unproven {
					// A losing duplicate retires into the session, its
					// frames read as the peer's: it must prove it too.
					g.refuseClaim(a, &d)
					break
				}
				d.loser, d.winner = a, ex
			case refuseFresh:
				d.reject, d.text = rejectDuplicate, "the other connection between these nodes wins"
			}
		}
	}
	return d
}

// refuse carries out decideAttach's refusal of a, whose peer said h
// (peers.mu held; refuse unlocks it).
func (g *gate) refuse(a *assoc, h *hello, d admission) {
	g.n.peers.forgetAssoc(a)
	first := d.quarantined != nil && g.n.peers.quarantine.noteRefused(h.uid)
	g.n.peers.mu.Unlock()
	if first {
		g.n.peers.logRefusedQuarantined(a, h, d.quarantined)
	}
	if d.impostor {
		label := a.label()
		if a.conn != nil && !a.outbound {
			label = peerLabel(a.conn)
		}
		err := fmt.Errorf("%w: %s", ErrAuth, d.text)
		g.n.log.Warn("troupe: refused a connection that claims another's session", "peer", label, "claimed_uid", h.uid.String(), "claimed_name", h.name, "err", err)
		g.n.totals.authRefused.Add(1)
		g.n.events.emit(ProtocolError{Remote: label, Err: err})
	}
	if a.outbound {
		// The peer accepted this connection: tell it that this node
		// does not, or it would wait for the session to come back.
		sayBye(a.conn, byeRefused, d.text)
		if q := d.quarantined; q != nil {
			a.fail(fmt.Errorf("%s: %w since %s (%v); ClearQuarantine with Reconnect to try again", a.dialAddr, ErrQuarantined, q.Since.Format(time.RFC3339), q.Cause))
			return
		}
		if d.impostor {
			a.fail(fmt.Errorf("%w: %s", ErrAuth, d.text))
			return
		}
		a.fail(errors.New(d.text))
		return
	}
	a.conn.Write(rejectFrame(d.reject, g.n.uid, d.text))
	a.conn.Close()
	a.finish()
}

// writeWelcome writes an acceptor's welcome, if it has one to write; a
// failed write ends the session through the reader.
func writeWelcome(c net.Conn, welcome []byte) {
	if welcome != nil {
		c.Write(welcome)
	}
}

// awaitWinner parks an outbound association whose connection lost a
// simultaneous dial: it is merged into the peer's connection once that is
// attached, or fails after mergeWait.
func (g *gate) awaitWinner(a *assoc, uid NodeUID) {
	g.n.peers.mu.Lock()
	if w := g.n.peers.byUID[uid]; w != nil {
		g.n.peers.mu.Unlock()
		a.mergeInto(w)
		return
	}
	g.n.peers.awaiting[uid] = append(g.n.peers.awaiting[uid], a)
	g.n.peers.mu.Unlock()
	t := time.NewTimer(mergeWait)
	defer t.Stop()
	select {
	case <-a.stop:
	case <-t.C:
		g.n.peers.mu.Lock()
		g.n.peers.awaiting[uid] = slices.DeleteFunc(g.n.peers.awaiting[uid], func(x *assoc) bool { return x == a })
		g.n.peers.mu.Unlock()
		a.fail(errors.New("the peer chose its own connection, which never arrived"))
	}
}

// suspendFor prepares the resume an inbound hello asks for: if the
// session with uid is still up here (this side has not yet seen its
// connection break), its connection is closed and its reader awaited, so
// that the session is suspended, with everything it received counted,
// before the new connection takes it over.
func (g *gate) suspendFor(uid NodeUID) {
	n := g.n
	n.peers.mu.Lock()
	ex := n.peers.byUID[uid]
	n.peers.mu.Unlock()
	if ex == nil || !ex.peer.resumable {
		return
	}
	ex.mu.Lock()
	up, conn := ex.life.state == assocUp && ex.life.endCause == nil, ex.conn
	ex.mu.Unlock()
	if !up {
		return
	}
	conn.Close()
	t := time.NewTimer(n.cfg.HandshakeTimeout)
	defer t.Stop()
	select {
	case <-ex.readerDone:
	case <-t.C:
	case <-n.lc.done:
	}
}
