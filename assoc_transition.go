package troupe

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"time"
)

// Carrying out a session's transitions: the one place where an
// association's life moves (life.step decides, in assoc_state.go) and
// where what the move asks for happens, in two halves: under mu, what
// must be taken from the session or changed with it; outside it, all
// that reaches other goroutines (dead letters, failed asks, events, the
// peer table, the connection).

// taken is what a transition took from the session under mu, for its
// effects to act on outside it.
type taken struct {
	from         life // before the step
	conn         net.Conn
	observer     bool
	err          error // why it ended (an end)
	unacked, out frameChain
	queue        recQueue
	pending      map[pendingAsk]struct{}
	resolves     map[uint64]chan resolveAnswer
	watches      map[watchPair]struct{}
	watchedBy    map[inWatch]*handle
	winner       *assoc // a lost merge's winner, as it stood (merges followed)
	// What a resume frame released: the frames sent again, and how long
	// the link was down.
	resent int
	down   time.Duration
}

// transition steps the session by ev and carries out the effects. It
// reports whether the event applied.
func (a *assoc) transition(ev lifeEvent) bool {
	var tk taken
	a.mu.Lock()
	eff, ok := a.stepLocked(ev, &tk)
	a.mu.Unlock()
	a.carryOut(eff, &tk)
	return ok
}

// stepLocked steps the session by ev and takes into tk what the effects
// need (mu held); the caller carries them out once it has unlocked.
func (a *assoc) stepLocked(ev lifeEvent, tk *taken) (effect, bool) {
	if ev.kind == evEnded && a.peer.observer {
		// An observer's session ends quietly, whatever ended it, on both
		// ends: the observer does not quarantine what it inspects either
		// (it dials again on its next call).
		ev.closing = true
	}
	next, eff, ok := a.life.step(ev)
	tk.from, tk.conn, tk.observer = a.life, a.conn, a.peer.observer
	a.life = next
	if eff&effWake != 0 {
		a.wakeSenders()
		a.wakeCredited()
	}
	if eff&effMarkEnding != 0 {
		a.endingAt.Store(time.Now().UnixNano())
	}
	if eff&effSayGaveUp != 0 && a.conn != nil {
		a.conn.SetWriteDeadline(time.Now().Add(byeGrace))
	}
	if eff&effFailPending != 0 {
		tk.pending, a.reqs.asks = a.reqs.asks, map[pendingAsk]struct{}{}
	}
	if eff&effDropQueued != 0 {
		tk.queue, tk.out = a.takeQueue(), a.out.take()
		a.pushControl(appendBye(nil, byeLeaving, ""))
	}
	if eff&(effRetire|effHandOver) != 0 {
		if eff&effRetire != 0 {
			a.queue.push(outRec{msg: ctlFrame(appendBye(nil, byeDuplicate, ""))})
		} else {
			tk.queue = a.takeQueue()
		}
		tk.pending, tk.watches, tk.resolves, tk.watchedBy = a.reqs.asks, a.reqs.watches, a.reqs.resolves, a.reqs.watchedBy.take()
		a.reqs.asks, a.reqs.watches, a.reqs.resolves = map[pendingAsk]struct{}{}, map[watchPair]struct{}{}, map[uint64]chan resolveAnswer{}
		a.mergedTo.Store(next.mergedInto)
	}
	if eff&effHeldLost != 0 {
		tk.unacked, tk.out = a.win.unacked.take(), a.out.take() // (the queue was handed over)
	}
	if eff&(effEnd|effRetiredEnd) != 0 {
		tk.unacked, tk.out, tk.queue = a.takeHeld()
	}
	if eff&effEnd != 0 {
		tk.err = next.err
		tk.pending, tk.resolves, tk.watches, tk.watchedBy = a.reqs.asks, a.reqs.resolves, a.reqs.watches, a.reqs.watchedBy.take()
		a.reqs.asks, a.reqs.resolves, a.reqs.watches = nil, nil, nil
	}
	return eff, ok
}

// carryOut does, outside mu, what a transition asked for.
func (a *assoc) carryOut(eff effect, tk *taken) {
	if eff&effFailPending != 0 {
		for p := range tk.pending {
			p.fail(ErrNodeClosed)
		}
		a.deadLettersOf(&tk.out, ErrNodeClosed, false)
		a.deadLetters(tk.queue, ErrNodeClosed)
	}
	if eff&effSayGaveUp != 0 && tk.conn != nil {
		a.notify() // the writer says it, and closes
		select {
		case <-a.writerDone:
			closeHard(tk.conn) // no writer to say it
		default:
		}
	}
	if eff&effCloseHard != 0 && tk.conn != nil {
		closeHard(tk.conn) // no goodbye to say (the session was not up): what waits for the peer goes
	}
	if eff&effEndAsClosing != 0 {
		a.fail(ErrNodeClosed) // never came up: nothing to say goodbye on
	}
	if eff&(effRetire|effHandOver) != 0 {
		a.carryOutMerge(eff, tk)
	}
	if eff&effEnd != 0 {
		a.carryOutEnd(eff, tk)
	}
	if eff&effRetiredEnd != 0 {
		// A retired duplicate: its work moved to the winner already, but
		// for what it had not written or the peer had not confirmed.
		unwritten := &sessionError{peer: a.label(), cause: errors.New("duplicate connection retired before it wrote this")}
		a.deadLettersOf(&tk.out, unwritten, false)
		a.deadLetters(tk.queue, unwritten)
		if tk.conn != nil {
			tk.conn.Close()
		}
		a.finish()
		a.deadLettersOf(&tk.unacked, &sessionError{peer: a.label(), cause: errors.New("duplicate connection retired before the peer confirmed")}, true)
	}
	if eff&effSuspended != 0 {
		a.suspended()
	}
	if eff&effNotify != 0 {
		a.notify()
	}
	if eff&effResumed != 0 {
		a.n.log.Info("troupe: session with peer resumed", "peer", a.label(), "down", tk.down, "resent", tk.resent)
		a.n.totals.linksResumed.Add(1)
		a.n.events.emit(PeerResumed{Addr: a.addr(), UID: a.peer.uid, Name: a.peer.name, Resent: tk.resent, Down: tk.down})
	}
}

// abort ends an up session from a goroutine other than its reader: it
// records why, and has the writer tell the peer that this node gave up
// on it (a link that still carries bytes carries that at once) and close
// the connection; the reader ends the session after its last delivery.
// The goodbye gets byeGrace: a writer stuck on a peer that does not read
// is cut off by then.
func (a *assoc) abort(cause error) {
	a.transition(lifeEvent{kind: evGiveUp, cause: cause})
}

// leave queues a bye: the peer learns this node is closing. Nothing more is
// accepted for sending. With now, what was queued is dropped (as dead
// letters) and the bye goes in its place; otherwise it follows the queue.
func (a *assoc) leave(now bool) {
	a.transition(lifeEvent{kind: evLeave, now: now})
	a.notify() // (a retiring writer waiting for the peer's bye ends now)
}

// fail ends the session with err: queued messages become dead letters,
// pending asks and resolves fail, and every local watcher of an actor on
// the peer gets Terminated. A session that was up and did not end by a
// goodbye from either side (the peer went silent, its connection broke, or
// it sent something malformed) quarantines the peer.
func (a *assoc) fail(err error) {
	a.transition(a.endEvent(err))
}

// endEvent is the event that ends the session with err (see fail).
func (a *assoc) endEvent(err error) lifeEvent {
	closing := a.n.cfg.Observer
	select {
	case <-a.n.lc.done:
		closing = true
	default:
	}
	return lifeEvent{kind: evEnded, cause: err, closing: closing}
}

// carryOutEnd carries out an end: the peer's loss published, the peer
// quarantined, and everything that waited on the session failed.
func (a *assoc) carryOutEnd(eff effect, tk *taken) {
	a.dropWatchedBy(tk.watchedBy)
	err := tk.err
	reason := err
	quarantine := eff&effQuarantine != 0 && !a.exemptFromQuarantine() // (it takes the peer-table lock)
	if quarantine {
		a.n.peers.addQuarantine(a, err)
		reason = &quarantineError{peer: a.label(), uid: a.peer.uid, cause: err}
		a.transition(lifeEvent{kind: evQuarantined, cause: reason})
		a.n.log.Warn("troupe: peer unreachable; quarantined until ClearQuarantine", "peer", a.label(), "uid", a.peer.uid.String(), "cause", err)
	}
	if tk.conn != nil {
		tk.conn.Close()
	}
	a.finish()
	serr := &sessionError{peer: a.label(), cause: reason, observer: tk.observer}
	if eff&effPublish != 0 {
		if errors.Is(err, ErrPeerLeft) {
			a.n.totals.peersLeft.Add(1)
		} else {
			a.n.totals.peersGivenUp.Add(1) // (quarantined, unless a cluster member or a registrar)
		}
		a.n.events.emit(PeerUnreachable{Addr: a.addr(), UID: a.peer.uid, Name: a.peer.name, Quarantined: quarantine, Reason: reason, LastHeard: a.lastHeard()})
	}
	a.deadLettersOf(&tk.unacked, serr, true)
	a.deadLettersOf(&tk.out, serr, false)
	a.deadLetters(tk.queue, serr)
	for p := range tk.pending {
		p.fail(serr)
	}
	for _, ch := range tk.resolves {
		ch <- resolveAnswer{err: serr}
	}
	for w := range tk.watches {
		w.watcher.signal(sysMsg{kind: sysTerminated, key: w.target, reason: reason})
	}
	if tk.from.state != assocConnecting {
		a.n.log.Debug("troupe: association ended", "peer", a.label(), "reason", reason)
	}
}

// mergeInto retires a, which lost a simultaneous dial, in favour of the
// winning association w with the same peer: sends through a go to w from
// now on, and its pending asks and watches move there. A connection that
// never came up is dropped with its queue moved to w; one that is up
// writes what it has queued and a duplicate-bye, and keeps reading until
// the peer answers with its own bye, so nothing in flight is lost; the
// winner writes nothing of its queue until a has ended, so the peer reads
// each sender's messages in order.
func (a *assoc) mergeInto(w *assoc) {
	a.mu.Lock()
	if _, ok := nextState(a.life.state, evLostMerge); !ok {
		a.mu.Unlock()
		return
	}
	t := w.lockTarget() // lock order: a, then the winner
	ev := lifeEvent{kind: evLostMerge, winner: w, gone: t.life.state >= assocLeaving, resuming: t.tab.resumes == a}
	var tk taken
	eff, _ := a.stepLocked(ev, &tk)
	tk.winner = t
	if eff&effRetire != 0 && eff&effWinnerGone == 0 {
		// a writes what it holds and a duplicate-bye over its own
		// connection: the winner's frames wait until it has ended, or
		// the peer could read a later message before an earlier one.
		// Not for longer than retireHold: a retire that stalls (a link
		// cut, a peer that stood still) must not hold a link that
		// works.
		t.dup.behind++
		a.dup.ahead = t
		a.dup.hold = time.AfterFunc(retireHold, a.releaseAhead)
	}
	if eff&effWinnerGone == 0 {
		// What waits on a moves to the winner, in one piece with it.
		if eff&effTakeOver != 0 {
			a.takeOver(t, tk.queue)
		} else {
			t.queue.appendQueue(tk.queue)
		}
		for p := range tk.pending {
			t.reqs.asks[p] = struct{}{}
		}
		for k, ch := range tk.resolves {
			t.reqs.resolves[k] = ch
		}
		t.reqs.watchedBy.merge(tk.watchedBy)
		for p := range tk.watches {
			t.reqs.watches[p] = struct{}{}
		}
	}
	t.mu.Unlock()
	a.mu.Unlock()
	a.carryOut(eff, &tk)
}

// carryOutMerge carries out a lost merge, once a and the winner are unlocked.
func (a *assoc) carryOutMerge(eff effect, tk *taken) {
	if eff&effWinnerGone != 0 {
		// What a held is encoded for its own tables: it cannot move to
		// another session, and the winner is gone too. (A retiring a
		// drains over its own connection.)
		err := tk.winner.failure()
		a.deadLettersOf(&tk.unacked, err, true)
		a.deadLettersOf(&tk.out, err, false)
		a.endMoved(tk.queue, tk.pending, tk.watches, tk.resolves, err)
		a.dropWatchedBy(tk.watchedBy)
	} else {
		tk.winner.notify()
	}
	// The address a dialed reached w's peer (its hello, or its refusal
	// of a duplicate, said so): sends to that address go to w now.
	w := a.mergedTo.Load()
	a.n.peers.mu.Lock()
	if a.outbound && a.n.peers.byAddr[a.dialAddr] == a {
		a.n.peers.byAddr[a.dialAddr] = w
	}
	if a.outbound && !slices.Contains(w.tab.proven, a.dialAddr) {
		w.tab.proven = append(w.tab.proven, a.dialAddr)
	}
	a.n.peers.mu.Unlock()
	a.n.peers.untable(a)
	a.closeReady()
	if eff&effRetire != 0 {
		a.notify()
		tk.conn.SetReadDeadline(time.Now().Add(retireDrain))
		return
	}
	if tk.conn != nil {
		tk.conn.Close()
	}
	a.finish()
	if eff&(effHeldLost|effWinnerGone) == effHeldLost {
		err := &sessionError{peer: a.label(), cause: errors.New("the connection was replaced before the peer confirmed")}
		a.deadLettersOf(&tk.unacked, err, true)
		a.deadLettersOf(&tk.out, err, false)
	}
}

// endMoved fails what a merge could not hand over because the winner had
// ended too.
func (a *assoc) endMoved(queue recQueue, pending map[pendingAsk]struct{}, watches map[watchPair]struct{}, resolves map[uint64]chan resolveAnswer, err error) {
	a.deadLetters(queue, err)
	for p := range pending {
		p.fail(err)
	}
	for _, ch := range resolves {
		ch <- resolveAnswer{err: err}
	}
	for w := range watches {
		w.watcher.signal(sysMsg{kind: sysTerminated, key: w.target, reason: err})
	}
}

// takeQueue empties the queue of records and returns what it held (mu
// held); an encoding of its first record in progress is dropped.
func (a *assoc) takeQueue() recQueue {
	a.qgen++
	return a.queue.take()
}

// The means of a session's end: the goodbye to a peer this node gave up
// on, then a reset so the kernel keeps nothing the peer never read; and
// what was queued or unacknowledged becoming dead letters. life.step
// (assoc_state.go) decides what an end does; transition
// (assoc_transition.go) carries it out with these.

// byeGrace bounds the goodbye this node writes to a peer it gave up on:
// a link that carries it carries it at once.
const byeGrace = 100 * time.Millisecond

// rawConn is the network connection under c (a TLS connection's).
func rawConn(c net.Conn) net.Conn {
	if w, ok := c.(interface{ NetConn() net.Conn }); ok {
		return w.NetConn()
	}
	return c
}

// closeWrite ends c's writing side (TCP and Unix sockets send a FIN, TLS
// its close_notify), so that the peer reads to the end of what was
// written and then EOF, while this side reads on; a connection that
// cannot half-close is closed.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	if cw, ok := rawConn(c).(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}

// closeHard closes c with a reset rather than a FIN: what this node wrote
// and the peer never read is thrown away at once. Closed the ordinary way,
// a connection whose peer stopped reading outlives its close in the
// kernel, holding its unsent bytes behind a FIN that cannot go, and the
// peer's writes can block for minutes on a window that never opens. It is
// for a session this node gave up on; a peer that reads has had its
// goodbye by then.
func closeHard(c net.Conn) {
	raw := rawConn(c)
	if tc, ok := raw.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	raw.Close() // (for TLS: no close_notify to a peer that does not read)
	if raw != c {
		c.Close()
	}
}

// heldBinder binds the refs of a payload this node encoded for the peer,
// read back: sender and receiver swap places (the sender's actors are
// this node's, the receiver's the peer's).
type heldBinder struct{ a *assoc }

func (b heldBinder) bindRef(kind byte, key refKey, addr string) *handle {
	switch kind {
	case refSender:
		kind = refReceiver
	case refReceiver:
		kind = refSender
	}
	return b.a.bindRefFrom(kind, key, addr, NodeUID{}) // refs this node sent: nobody's to be charged
}

// sayGaveUp writes the goodbye that tells the peer this node gave up on
// it (and why), then ends this node's half of the stream; the reader ends
// the session once the peer closes its half. A peer that reads gets the
// goodbye and closes at once. One that does not read would keep the
// connection open in the kernel, its unread bytes held behind a FIN that
// cannot go: byeGrace after the abort, the heartbeat loop closes it with
// a reset (closeLate).
func (a *assoc) sayGaveUp(cause error) {
	text := ""
	if cause != nil {
		text = cause.Error()
		if len(text) > maxByeText {
			text = text[:maxByeText]
		}
	}
	if _, err := a.conn.Write(appendWhole(nil, appendBye(nil, byeGaveUp, text))); err != nil {
		closeHard(a.conn) // the goodbye cannot reach the peer
		return
	}
	if tc, ok := rawConn(a.conn).(*net.TCPConn); ok {
		tc.CloseWrite()
		return
	}
	a.conn.Close()
}

// unwritten is the dead-letter reason of a message this session's
// connection broke before it was written.
func (a *assoc) unwritten() error {
	if err := a.failure(); err != nil {
		return err
	}
	return &sessionError{peer: a.label(), cause: errors.New("the connection broke before the message was written")}
}

// deadLetters publishes a dead letter for every message in q.
func (a *assoc) deadLetters(q recQueue, err error) {
	q.each(func(r *outRec) {
		if r.h != nil {
			a.n.dead.deadLetterTo(r.h.key, r.h.String(), r.msg, err, false)
		}
	})
}

// deadLettersOf publishes a dead letter for every tell frame in c, which
// this session encoded: its message is decoded again (an equal value,
// not the one sent). unconfirmed: the frames were written, and the peer
// may have received them.
func (a *assoc) deadLettersOf(c *frameChain, err error, unconfirmed bool) {
	if c.tells == 0 {
		return
	}
	c.each(func(f []byte) bool {
		body := f[frameBodyAt(f):]
		fields := body[1:]
		switch frameKind(body[0]) {
		case frameTell:
		case frameTellHeaders:
			_, fields, _ = parseHeaders(fields)
		default:
			return true
		}
		to, target, msg := a.decodeHeld(fields)
		a.n.dead.deadLetterTo(to, target, msg, err, unconfirmed)
		return true
	})
}

// decodeHeld reads back a tell frame's body that this session encoded:
// the target's key (zero if not known) and ref string, and the message.
func (a *assoc) decodeHeld(b []byte) (refKey, string, any) {
	var th tellHeader
	payload, err := parseTell(b, &th)
	if err != nil {
		return refKey{}, "", nil
	}
	to := refKey{node: a.peer.uid, path: th.path, uuid: th.uuid}
	if !th.targetInline {
		to = refKey{}
		if th.target > 0 && th.target <= uint64(len(a.enc.targetKeys)) {
			to = a.enc.targetKeys[th.target-1]
		}
	}
	target := FormatRef(a.addr(), to.path)
	var mt *msgType
	switch {
	case th.typInline:
		mt = typeByKey(th.key)
	case th.typ > 0 && th.typ <= uint64(len(a.enc.typeList)):
		mt = a.enc.typeList[th.typ-1]
	}
	if mt == nil {
		return to, target, nil
	}
	d := decoder{binder: heldBinder{a}}
	msg, err := d.payload(mt, payload)
	if err != nil {
		return to, target, nil
	}
	return to, target, msg
}

// takeHeld empties what the session holds for the peer (mu held): the
// frames written and not acknowledged, those encoded and not written,
// and the records not yet encoded. Their blocks are left to the garbage
// collector, not recycled: the writer may still be writing them.
func (a *assoc) takeHeld() (unacked, out frameChain, queue recQueue) {
	unacked, out, queue = a.win.unacked.take(), a.out.take(), a.takeQueue()
	return
}

// A link flap: a resumable session whose connection broke without a
// goodbye is suspended, not ended. Sends to the peer queue up; the side
// that dialed dials again at once and keeps trying; the same incarnation
// answering resumes the session, and each side sends again what the other
// had not confirmed, so every sequenced frame arrives once and in order.
// A refusal or a new incarnation ends the session at once; silence past
// Config.UnreachableAfter ends it as it ends a session that stays up.

// Bounds of the dialer's retries after a flap: the first is immediate,
// then the wait doubles from redialMin, capped at redialMax, until
// UnreachableAfter has passed since the peer was last heard.
const (
	redialMin = 10 * time.Millisecond
	redialMax = 250 * time.Millisecond
)

// lost is how the reader ends on a broken connection: a resumable session
// that was up is suspended; anything else ends.
func (a *assoc) lost(err error) {
	a.mu.Lock()
	ev := lifeEvent{kind: evLinkLost, cause: err, resumable: a.peer.resumable && !a.n.lc.flushBegun()}
	_, _, resumable := a.life.step(ev) // (a question: nothing moves yet)
	conn := a.conn
	a.mu.Unlock()
	if !resumable {
		a.fail(err)
		return
	}
	// The writer exits first, so that what it held is either written and
	// unconfirmed (sent again on resume) or back in the queue.
	conn.Close()
	a.stopOnce.Do(func() { close(a.stop) })
	<-a.writerDone
	ev.at = time.Now()
	if !a.transition(ev) {
		a.fail(err)
	}
}

// suspended carries out a suspension: the session waits for a new
// connection, which the dialer seeks.
func (a *assoc) suspended() {
	a.mu.Lock()
	err := a.life.lostCause
	a.mu.Unlock()
	a.n.log.Info("troupe: connection to peer lost; resuming", "peer", a.label(), "cause", err)
	a.n.totals.linksLost.Add(1)
	a.n.events.emit(PeerLinkLost{Addr: a.addr(), UID: a.peer.uid, Name: a.peer.name, Cause: err})
	if a.outbound {
		a.n.wg.Go(a.redial)
		return
	}
	// The acceptor waits for the dialer's new connection; the heartbeat
	// loop ends the wait after UnreachableAfter. Meanwhile it asks the
	// dialer's proven address, if it has one, who answers there.
	a.n.peers.mu.Lock()
	var back Addr
	if len(a.tab.proven) > 0 {
		back = a.tab.proven[0]
	}
	a.n.peers.mu.Unlock()
	if !back.IsZero() {
		a.n.wg.Go(func() { a.watchBack(back) })
	}
}

// watchBack follows a suspended session on the side that was dialed: it
// cannot dial the session back, but it can ask the peer's proven address
// who answers there, without associating. A refusal, or another
// incarnation, means the peer is gone: the session ends at once (a killed
// process is seen in milliseconds by both sides). The same incarnation
// means it is alive and will dial back; the window decides if it does not.
func (a *assoc) watchBack(addr Addr) {
	a.whileSuspended(func(cause error, silent bool) bool {
		if silent {
			return true // the heartbeat loop's to end it
		}
		uid, err := a.n.peers.probeAt(addr)
		switch {
		case err != nil && isRefused(err):
			a.fail(fmt.Errorf("%v, and %s now refuses connections", cause, addr))
			return true
		case uid != (NodeUID{}) && uid != a.peer.uid:
			a.fail(fmt.Errorf("%v, and another incarnation answers at %s", cause, addr))
			return true
		}
		return false
	})
}

// whileSuspended calls try at once, then after a wait that doubles from
// redialMin up to redialMax, for as long as the session stays suspended
// and the node open, until try says it is done. try is told why the
// connection broke, and whether the peer has been silent for
// UnreachableAfter.
func (a *assoc) whileSuspended(try func(cause error, silent bool) (done bool)) {
	n := a.n
	var wait time.Duration
	for {
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-n.lc.flushing: // (a flap during a drain resumes)
				t.Stop()
				return
			case <-t.C:
			}
		}
		wait = min(max(2*wait, redialMin), redialMax)
		a.mu.Lock()
		suspended, cause := a.life.state == assocSuspended, a.life.lostCause
		a.mu.Unlock()
		if !suspended || try(cause, time.Since(a.silentSince()) >= n.cfg.UnreachableAfter) {
			return
		}
	}
}

// silentSince is when the peer was last heard, or the session came up.
func (a *assoc) silentSince() time.Time {
	a.mu.Lock()
	since := a.life.upAt
	a.mu.Unlock()
	if h := a.lastHeard(); h.After(since) {
		since = h
	}
	return since
}

// redial dials a suspended session's peer again until the session is
// resumed, or it is clear that it cannot be.
func (a *assoc) redial() {
	n := a.n
	a.whileSuspended(func(cause error, silent bool) bool {
		if silent {
			a.fail(fmt.Errorf("%v, and no new connection within %v", cause, n.cfg.UnreachableAfter))
			return true
		}
		n.peers.mu.Lock()
		held := n.peers.byUID[a.peer.uid]
		n.peers.mu.Unlock()
		switch {
		case held == nil:
			// Out of the table for a moment (a duplicate's winner not yet
			// attached): the peer would have no session here to resume
			// into. Wait; the window decides if it stays so.
			return false
		case held != a:
			// Another session with the peer took this one's place: the
			// peer, asked to resume, would resume that one, whose state
			// this connection would not carry. This one ends quietly (no
			// quarantine: the peer is there, in the other session).
			a.fail(fmt.Errorf("%w: %v, and another session with the peer took its place", errSessionReplaced, cause))
			return true
		}
		c, err := n.peers.dial(a.dialAddr)
		if err != nil {
			if isRefused(err) {
				a.fail(fmt.Errorf("%v, and %s now refuses connections", cause, a.dialAddr))
				return true
			}
			return false
		}
		fresh := newAssoc(n, true, a.dialAddr)
		fresh.resumeOf = a
		fresh.dialOnce.Do(func() {}) // it never dials by itself
		n.peers.mu.Lock()
		if n.peers.closing {
			n.peers.mu.Unlock()
			c.Close()
			return true
		}
		n.peers.all[fresh] = struct{}{}
		n.peers.outbound++
		n.peers.mu.Unlock()
		a.n.gate.runDialed(fresh, c) // on success, reads until that session ends
		a.mu.Lock()
		suspended := a.life.state == assocSuspended
		a.mu.Unlock()
		if !suspended {
			return true // resumed, or ended
		}
		if err := fresh.failure(); errors.Is(err, ErrRejected) {
			a.fail(fmt.Errorf("%v, and the peer refused the new connection: %w", cause, err))
			return true
		}
		return false
	})
}

// takeOver moves a suspended session's sequence state into w, the new
// connection that resumes it, before w's reader and writer start: what
// this side received (for w's resume frame and acknowledgements) and what
// the peer had not confirmed (sent again once the peer's resume frame says
// where to start). w holds its queue until then. Both are locked.
func (a *assoc) takeOver(w *assoc, moved recQueue) {
	w.win.unacked, w.win.acked = a.win.unacked.take(), a.win.acked
	// The session's counts go on (Stats, /metrics): what the old
	// connections carried, beside what w's will.
	w.traffic.bytesOutBase, w.traffic.tellsOutBase = a.traffic.bytesOutBase+a.traffic.written.Load(), a.traffic.tellsOutBase+a.traffic.tellsOut.Load()
	w.traffic.bytesInBase = a.traffic.bytesInBase
	if a.in != nil {
		w.traffic.bytesInBase += a.in.bytes.Load()
	}
	// What a encoded refers to a's tables, which the peer keeps for the
	// session: w goes on with them, and its reader with a's in tables.
	// (w encodes nothing before its writer starts.)
	w.out = a.out.take()
	w.enc.types, w.enc.targets, w.enc.targetKeys, w.enc.typeList = a.enc.types, a.enc.targets, a.enc.targetKeys, a.enc.typeList
	w.rd.inTypes, w.rd.inTargets, w.rd.inShapes, w.rd.shapeBytes = a.rd.inTypes, a.rd.inTargets, a.rd.inShapes, a.rd.shapeBytes
	w.peerDraining, w.rd.incompatLogged = a.peerDraining, a.rd.incompatLogged
	if w.peerToken == nil {
		w.peerToken = a.peerToken // the session's, until w's token frame
	}
	// Credit goes on with the tables: what the peer granted, and the
	// accounts of what this side granted, which now answer to w.
	w.enc.peerMailbox, w.enc.sent, w.enc.granted = a.enc.peerMailbox, a.enc.sent, a.enc.granted
	a.due.moveTo(w)
	// The resume frame acknowledges everything received: an acknowledgement
	// of less (a count the old reader had not yet handed on) must not
	// follow it.
	w.rd.rcvTells, w.rd.ackQueued, w.wr.ackSent = a.rd.rcvTells, a.rd.rcvTells, a.rd.rcvTells
	w.ackTo.Store(a.rd.rcvTells)
	w.open.resumeRcv, w.open.resume = a.rd.rcvTells, true
	w.stepLocked(lifeEvent{kind: evTakenOver, at: a.life.lostAt}, &taken{}) // (no effects)
	w.win.ackMoved = time.Now()                                             // the peer's acknowledgements may move again from now
	// What waited here goes before anything sent to w meanwhile.
	moved.appendQueue(w.takeQueue())
	w.queue = moved
}
