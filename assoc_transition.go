package troupe

import (
	"errors"
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
// the peer answers with its own bye, so nothing in flight is lost.
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
