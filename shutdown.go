package troupe

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Waits that are not settings: each bounds one rare wait, with room for a
// slow peer, and none is a handshake.
const (
	// mergeWait bounds how long a connection that lost a simultaneous
	// dial waits for the peer's winning connection to arrive.
	mergeWait = 5 * time.Second
	// retireDrain bounds how long a retired duplicate connection keeps
	// reading (frames in flight, the peer's bye) before it is closed.
	retireDrain = 5 * time.Second
	// retireHold bounds how long the connection kept in a simultaneous
	// dial holds its queue while the retired one drains: a round trip or
	// two on a working link.
	retireHold = 250 * time.Millisecond
	// closeByeWait bounds how long Close waits for the writers to send
	// their bye: long enough for a loopback or LAN write, short enough
	// that Close still ends "at once".
	closeByeWait = 250 * time.Millisecond
)

// Close stops the node at once. Dials and handshakes in progress are
// aborted; on every association that is up, what is still queued becomes
// dead letters ([ErrNodeClosed]) and a goodbye is written in its place
// (for at most a quarter of a second), so that peers learn that this node
// left (their watchers of its actors get [Terminated] with [ErrPeerLeft])
// rather than guess it died. Every actor stops after the handler it is
// running returns. Close waits for every goroutine the node started.
//
// Close does not unregister from registrars one by one: a registrar drops
// a node's registrations when its association ends. Use [Node.Shutdown]
// to deliver what is queued first.
//
// A cluster member leaves first, as [Cluster.Close] does: that waits at
// most twice the cluster's leave wait (3 gossip intervals, 1 s to 5 s),
// so that the others see a leave rather than a crash.
//
// Close is idempotent; it may be called during a Shutdown, which it makes
// finish at once. Calls after the first return the first one's result.
func (n *Node) Close() error {
	n.lc.hurryOnce.Do(func() { close(n.lc.hurry) })
	n.lc.closeOnce.Do(func() {
		n.lc.leaveCluster(context.Background(), nil, false)
		n.lc.closeErr = n.lc.shutdown(context.Background(), false)
	})
	return n.lc.closeErr
}

// crash closes the node as a crash would look to others: no cluster
// leave (FaultNet.Kill).
func (l *lifecycle) crash() error {
	l.hurryOnce.Do(func() { close(l.hurry) })
	l.closeOnce.Do(func() { l.closeErr = l.shutdown(context.Background(), false) })
	return l.closeErr
}

// leaveCluster leaves the cluster this node is a member of, if any, before
// the node stops: the others see a leave (leaving, exiting, removed), not
// a crash. It waits until the leader has moved this member to exiting, for
// at most the cluster's leave wait, ctx, or until hurry is closed. Before
// that it hands the member's shards over, for at most twice
// HandOffTimeout if patient (Shutdown), else for at most the leave wait
// (Close, which stops at once).
func (l *lifecycle) leaveCluster(ctx context.Context, hurry <-chan struct{}, patient bool) {
	if p := l.n.cl.plug.Load(); p != nil {
		p.leave(ctx, hurry, patient)
	}
}

// Shutdown stops the node gracefully: it unregisters its actors and
// itself, stops accepting connections and tells its peers it takes no new
// asks ([ErrPeerShuttingDown]), stops every actor (each after the handler
// it is running, whose replies still reach other nodes), writes
// everything queued for peers followed by a goodbye, and then closes, as
// [Node.Close]. Remote watchers of its actors hear [ErrPeerLeft] from the
// goodbye. It returns nil when all of
// that finished, or ctx.Err() when ctx ended first — the node is then
// closed at once, as by Close, before Shutdown returns. A call to Close
// during a Shutdown makes it finish at once too. One wait ctx cannot cut
// short: a handler that ignores its Context (Go cannot stop it) holds the
// node's last wait until it returns. The phases are [ShutdownPhase]'s.
func (n *Node) Shutdown(ctx context.Context) error {
	n.lc.closeOnce.Do(func() {
		n.lc.draining.Store(true)
		hookErr := n.lc.runHooks(ctx, PhaseLeave)
		n.lc.leaveCluster(ctx, n.lc.hurry, true)
		n.lc.closeErr = errors.Join(hookErr, n.lc.shutdown(ctx, true))
	})
	return n.lc.closeErr
}

// waitActors waits until every actor has terminated, or ctx ends (or
// Close hurries a Shutdown), so that the phases after PhaseActors are not
// held past the deadline by a handler that ignores its context (the
// node's last wait still is). It says which actors still run.
func (l *lifecycle) waitActors(ctx context.Context) error {
	done := make(chan struct{})
	l.n.wg.Go(func() { l.n.actors.live.Wait(); close(done) }) // (ends before the node's last wait does)
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	case <-l.hurry:
	}
	var running []string
	all, _ := l.n.actors.list()
	for _, h := range all {
		if _, ok := h.local.(batchTarget); !ok {
			continue // an ask's promise or an adapter, not an actor
		}
		running = append(running, h.key.path)
		if len(running) == 8 {
			break
		}
	}
	l.n.log.Warn("troupe: shutdown went on without waiting for actors still in a handler", "actors", running)
	err := ctx.Err()
	if err == nil {
		err = context.Canceled
	}
	return fmt.Errorf("%w: actors still in a handler: %v", err, running)
}

// shutdown closes the node; graceful says whether queued frames and
// unregistrations are delivered first (within ctx).
func (l *lifecycle) shutdown(ctx context.Context, graceful bool) error {
	defer close(l.closed) // after every goroutine of the node has ended
	l.draining.Store(true)
	close(l.done)
	forgetNode(l.n)
	if !graceful {
		l.dialCancel()   // a dial in progress has nobody left to serve
		l.cancelActors() // handlers waiting on their Context return now
	}
	var errs []error
	phase := func(p ShutdownPhase) {
		if graceful {
			if err := l.runHooks(ctx, p); err != nil {
				errs = append(errs, err)
			}
		}
	}
	phase(PhaseUnregister)
	if graceful {
		l.n.disc.unregisterAll() // queued ahead of the goodbyes below
	}
	if l.n.disc.store.active() {
		// Revoking the lease removes every entry at once; Close gives it
		// as long as it gives a goodbye.
		wait := closeByeWait
		if graceful {
			wait = min(l.n.disc.registryTimeout(), time.Second)
		}
		l.n.disc.store.revoke(wait)
	}
	phase(PhaseRefuse)
	errs = append(errs, l.n.lis.closeAll(true)...) // no listener is added after this
	if graceful {
		l.refuseWork()
	}
	phase(PhaseActors)
	if graceful {
		// Handlers in progress finish while the associations are up, so
		// that their replies reach the peers that asked; the goodbyes
		// follow them.
		if err := l.stopActors(ctx, graceful); err != nil {
			errs = append(errs, err)
		}
	}
	phase(PhaseFlush)
	close(l.flushing)
	l.dialCancel() // (the handlers Shutdown let finish might have dialed)
	assocs := l.n.peers.allWhere(true, nil)
	l.n.inbound.closeHandshakes()
	for _, a := range assocs {
		a.leave(!graceful)
	}
	if !graceful {
		// Peers first, so they hear that this node left rather than that
		// each actor stopped.
		if err := l.stopActors(ctx, graceful); err != nil {
			errs = append(errs, err)
		}
	}

	// Let the writers send what they hold and the goodbye: for as long as
	// ctx allows when graceful, briefly otherwise.
	wait, hurry := ctx, l.hurry
	if !graceful {
		var cancel context.CancelFunc
		wait, cancel = context.WithTimeout(ctx, closeByeWait)
		defer cancel()
		hurry = nil // Close itself: the short wait is its own
	}
	var late error
	for _, a := range assocs {
		if late == nil {
			select {
			case <-a.writerDone:
			case <-a.stop: // ended, or never came up: nothing to write
			case <-wait.Done():
				late = wait.Err()
			case <-hurry:
				late = context.Canceled
			}
		}
		a.fail(ErrNodeClosed)
	}
	if graceful && late != nil {
		errs = append(errs, late)
	}
	l.cancel()
	l.n.wg.Wait()
	l.n.disc.store.closeIdle()
	return errors.Join(errs...)
}

// refuseWork tells every peer that understands it that this node is
// shutting down (a draining frame, after everything queued before it):
// its senders refuse new asks of this node's actors with
// ErrPeerShuttingDown and look the names up again, while the replies of
// the handlers still running reach them. A session that comes up later
// is told in its handshake.
func (l *lifecycle) refuseWork() {
	l.refusing.Store(true)
	assocs := l.n.peers.allWhere(false, func(a *assoc) bool {
		select {
		case <-a.ready: // (attach set peer.flags before, under the association's lock)
		default:
			return false // its handshake, under peers.mu later, sees refusing
		}
		return a.peer.flags&helloDrains != 0
	})
	for _, a := range assocs {
		a.control(appendDraining(nil))
	}
}

// stopActors stops every actor (PhaseActors; for Close, after the
// goodbyes): each after the handler it runs, or with ShutdownDrain after
// its mailbox, waiting for them within ctx when graceful.
func (l *lifecycle) stopActors(ctx context.Context, graceful bool) error {
	targets := l.n.actors.close()
	if graceful && l.n.cfg.ShutdownDrain {
		// Every actor first handles what its mailbox holds, its
		// context live, within ctx; past ctx, the rest stop as below.
		// The stop goes to the top of each tree: a parent stops its
		// children once it has drained, and they drain in turn what it
		// sent them.
		l.drainingMailboxes.Store(true)
		for _, h := range targets {
			if c, ok := h.local.(interface{ topLevel() bool }); ok && c.topLevel() {
				h.local.sysPush(sysMsg{kind: sysStop, reason: ErrNodeClosed, drain: true})
			}
		}
		err := l.waitActors(ctx)
		if err == nil {
			l.cancelActors()
			return nil
		}
		drainErr := fmt.Errorf("the mailboxes did not drain: %w", err)
		l.drainingMailboxes.Store(false)
		for _, h := range targets {
			h.local.sysPush(sysMsg{kind: sysStop, reason: ErrNodeClosed})
		}
		l.cancelActors() // ctx has ended: nothing more is waited for
		return drainErr
	}
	for _, h := range targets {
		h.local.sysPush(sysMsg{kind: sysStop, reason: ErrNodeClosed})
	}
	// Every actor stops after the handler it runs: a handler waiting
	// on its context returns now. Shutdown waits for the others
	// within ctx.
	l.cancelActors()
	if graceful {
		return l.waitActors(ctx)
	}
	l.n.actors.live.Wait()
	return nil
}
