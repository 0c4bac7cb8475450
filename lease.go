package troupe

import (
	"context"
	"fmt"
	"time"
)

// leasePath is where a node that serves leases keeps its lease actor.
const leasePath = "/system/lease"

// LeaseWaitError is what a [Lease]'s Acquire returns when nobody holds
// the lease but it cannot be granted yet: a lease server that has just
// started grants nothing for one ttl (it may have forgotten a grant of
// its previous run). Wait is how long until it can, and must be more
// than zero. A cluster deciding a split waits that long and asks again
// (giving up when that would end more than 30 s after it first
// asked), rather than take the refusal for the other side's hold.
//
// Both sides of a split wait for the same moment, so the hold of the one
// that then wins still covers the other's decision: Wait must end no
// earlier than the first moment the lease could be granted to anyone (a
// Wait that is a retry back-off, or one that differs between the
// clients, could let a side ask again after the winner's hold and win
// too).
type LeaseWaitError struct {
	Wait time.Duration
}

// Error says that nobody holds the lease and how long until it can be
// granted.
func (e *LeaseWaitError) Error() string {
	return fmt.Sprintf("troupe: nobody holds the lease, and it can be granted only in %v (the lease server has just started)", e.Wait)
}

// maxLeaseWait is the longest a cluster deciding a split waits for a
// lease that cannot be granted yet ([LeaseWaitError]), counted from its
// first request; a longer wait is taken as a lease it cannot reach.
const maxLeaseWait = 30 * time.Second

// Lease is a lock with an expiry that lives outside a cluster's partition,
// so that at most one side of a split can hold it. Implementations are safe
// for concurrent use.
type Lease interface {
	// Acquire tries to take the lease for owner; it reports whether owner
	// holds it. While held, the implementation keeps it alive. When nobody
	// holds it but it cannot be granted to anyone yet, it may return a
	// [*LeaseWaitError] saying how long until it can (more than zero);
	// never while another owner holds it. An implementation that has no
	// such time returns false and a nil error, as when another holds it.
	Acquire(ctx context.Context, owner string) (bool, error)
	// Release gives the lease up if owner holds it, and stops keeping it
	// alive. It may be called after the lease was lost, even long after
	// (a cluster gives back a lease lost in its hold once the hold is
	// over): a lease another owner holds now must be left alone.
	Release(ctx context.Context, owner string) error
	// CheckHeld reports whether owner holds the lease, as far as this
	// process knows (it has not been told otherwise or failed to renew).
	CheckHeld(owner string) bool
	// Lost returns a channel closed when a held lease is lost.
	Lost() <-chan struct{}
}

// Lease operations on the wire. Append only.
const (
	leaseOpAcquire uint8 = iota + 1
	leaseOpRenew
	leaseOpRelease
)

type leaseRequest struct {
	Op      uint8
	Name    string
	Owner   string
	TTL     time.Duration
	ReplyTo Ref[leaseReply]
}

type leaseReply struct {
	Granted bool
	Owner   string // the holder, when not granted
	// Wait: not granted, nobody holds it, and the server grants nothing
	// for this long (its start-up quiet time). Zero from a server of an
	// earlier release.
	Wait time.Duration
}

func init() {
	SetWireKey[leaseRequest]("troupe.lease.request")
	SetWireKey[leaseReply]("troupe.lease.reply")
}

// ServeLeases makes n serve leases at /system/lease, for [NewNodeLease]
// clients — for example on a dedicated registrar, so that the lease lives
// on a third machine outside any partition of the cluster, with no extra
// software. It grants nothing for the first ttl of each request after it
// starts: a restarted server may have forgotten a grant that still runs.
func (n *Node) ServeLeases() error {
	type held struct {
		owner   string
		expires time.Time
	}
	table := map[string]held{}
	started := time.Now()
	_, err := Spawn(systemParent{n}, "lease", Behavior[leaseRequest]{Receive: func(_ *Context[leaseRequest], r leaseRequest) {
		now := time.Now()
		cur, ok := table[r.Name]
		// A server that has just started may have forgotten a grant of
		// its previous run that still runs: it grants nothing for one ttl.
		unheld := !ok || now.After(cur.expires) || cur.owner == r.Owner
		quiet := started.Add(r.TTL).Sub(now)
		free := unheld && quiet <= 0
		granted := false
		switch r.Op {
		case leaseOpAcquire, leaseOpRenew:
			if free && (r.Op == leaseOpAcquire || ok && cur.owner == r.Owner) {
				table[r.Name] = held{r.Owner, now.Add(r.TTL)}
				granted = true
			}
		case leaseOpRelease:
			if ok && cur.owner == r.Owner {
				delete(table, r.Name)
			}
			granted = true
		}
		if !r.ReplyTo.IsZero() {
			rep := leaseReply{Granted: granted, Owner: table[r.Name].owner}
			if !granted && unheld && quiet > 0 && r.Op == leaseOpAcquire {
				rep.Wait = quiet
			}
			r.ReplyTo.Tell(rep)
		}
	}})
	return err
}

// nodeLease is a [Lease] served by another troupe node ([Node.ServeLeases]).
type nodeLease struct {
	n         *Node
	server    Addr
	badServer error // why server did not parse; every call returns it
	name      string
	ttl       time.Duration

	mu     mutex[lkNodeLease]
	owner  string    // who holds it through this client, "" if nobody
	until  time.Time // when it expires at the server at the latest
	lost   chan struct{}
	cancel chan struct{} // stops the keep-alive
}

var _ Lease = (*nodeLease)(nil)

// NewNodeLease returns a client for the [Lease] name served by the node at
// server ([Node.ServeLeases]), an address in any form [ParseAddr] accepts
// (one that does not parse makes every call fail with an error wrapping
// [ErrBadAddr]). A held lease is renewed every ttl/3 by a goroutine owned
// by n; if a renewal fails before the lease expires, Lost is closed. A
// server that has just started and grants nothing yet, though nobody
// holds the lease, makes Acquire return a [*LeaseWaitError]. CheckHeld
// reports a lease held through this client while the last renewal the
// server granted still runs, counted from when it was asked for, for
// more than a fifth of the ttl. It needs no closing: its keep-alive ends
// with n.
func NewNodeLease(n *Node, server string, name string, ttl time.Duration) Lease {
	return newNodeLease(n, server, name, ttl)
}

func newNodeLease(n *Node, server string, name string, ttl time.Duration) *nodeLease {
	addr, err := ParseAddr(server)
	return &nodeLease{n: n, server: addr, badServer: err, name: name, ttl: ttl, lost: make(chan struct{})}
}

func (l *nodeLease) call(ctx context.Context, op uint8, owner string) (leaseReply, error) {
	if l.badServer != nil {
		return leaseReply{}, fmt.Errorf("lease server: %w", l.badServer)
	}
	ref, err := Resolve[leaseRequest](ctx, l.n, FormatRef(l.server, leasePath))
	if err != nil {
		return leaseReply{}, fmt.Errorf("lease server %s: %w", l.server, err)
	}
	return Ask(ctx, ref, func(r Ref[leaseReply]) leaseRequest {
		return leaseRequest{Op: op, Name: l.name, Owner: owner, TTL: l.ttl, ReplyTo: r}
	})
}

// Acquire tries to take the lease; while held it is kept alive. A server
// that has just started and grants nothing yet, though nobody holds the
// lease, makes it return a [*LeaseWaitError].
func (l *nodeLease) Acquire(ctx context.Context, owner string) (bool, error) {
	asked := time.Now()
	rep, err := l.call(ctx, leaseOpAcquire, owner)
	if err == nil && !rep.Granted && rep.Wait > 0 {
		return false, &LeaseWaitError{Wait: rep.Wait}
	}
	if err != nil || !rep.Granted {
		return false, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// The server counts the ttl from when it granted, which is after this
	// client asked: counting from the asking errs on the safe side.
	l.until = asked.Add(l.ttl)
	if l.owner == owner {
		return true, nil
	}
	l.owner = owner
	l.cancel = make(chan struct{})
	cancel := l.cancel
	l.n.wg.Go(func() { l.keepAlive(owner, cancel) })
	return true, nil
}

func (l *nodeLease) keepAlive(owner string, cancel chan struct{}) {
	keepLeaseAlive(l.ttl, cancel, l.n.lc.done, func(ctx context.Context) (bool, error) {
		asked := time.Now()
		rep, err := l.call(ctx, leaseOpRenew, owner)
		if err == nil && rep.Granted {
			l.mu.Lock()
			if l.owner == owner {
				l.until = asked.Add(l.ttl)
			}
			l.mu.Unlock()
		}
		return rep.Granted, err
	}, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.owner == owner {
			l.owner = ""
			close(l.lost)
			l.lost = make(chan struct{})
		}
	})
}

// keepLeaseAlive renews a held lease every ttl/3 until stop or quit is
// closed. When a renewal is refused, or none has succeeded for a whole
// ttl, it calls lost and returns.
func keepLeaseAlive(ttl time.Duration, stop, quit <-chan struct{}, renew func(context.Context) (bool, error), lost func()) {
	t := time.NewTicker(ttl / 3)
	defer t.Stop()
	lastOK := time.Now()
	for {
		select {
		case <-stop:
			return
		case <-quit:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), ttl/3)
		asked := time.Now()
		granted, err := renew(ctx)
		cancel()
		if err == nil && granted {
			lastOK = asked // the server's ttl runs from a moment after this
			continue
		}
		if err == nil || time.Since(lastOK) >= ttl {
			lost()
			return
		}
	}
}

// Release gives the lease up.
func (l *nodeLease) Release(ctx context.Context, owner string) error {
	l.mu.Lock()
	if l.owner == owner {
		l.owner = ""
		close(l.cancel)
	}
	l.mu.Unlock()
	_, err := l.call(ctx, leaseOpRelease, owner)
	return err
}

// CheckHeld reports whether owner holds the lease through this client:
// it took it, and the last renewal the server granted still runs, counted
// from when it was asked for (so never past the server's own expiry),
// for more than a fifth of the ttl.
func (l *nodeLease) CheckHeld(owner string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.owner == owner && owner != "" && heldUntil(l.until, l.ttl)
}

// Lost returns a channel closed when the held lease is lost.
func (l *nodeLease) Lost() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}
