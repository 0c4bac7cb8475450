package troupe

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// How the node's entries in an etcd registry converge to what the node
// holds, whatever happened in between (an election, an outage, a lease
// that expired): the node keeps the set it wants registered (its public
// actors and itself) and the set etcd confirmed, and one goroutine, the
// only one that writes, makes etcd hold the first: it puts what is
// missing and deletes what is stale, many at a time in one transaction,
// after every change, again after a failure until it succeeds, and reads
// the node's keys back every etcdVerifyEvery (anti-entropy: one range
// read a minute at rest). Spawn waits for its actor's entry (up to
// RegistryTimeout); an entry still missing then is registered as soon
// as etcd takes it, pending in Stats and Ready meanwhile.

const (
	// etcdVerifyEvery is how often the node reads its keys back.
	etcdVerifyEvery = time.Minute
	// etcdTxnOps bounds the operations of one transaction (etcd's
	// default --max-txn-ops).
	etcdTxnOps = 128
	// etcdRetryMin and etcdRetryMax bound the wait before a failed
	// reconciliation is tried again (it doubles).
	etcdRetryMin = 100 * time.Millisecond
	etcdRetryMax = 2 * time.Second
)

// etcdSync is the node's side of its etcd entries.
type etcdSync struct {
	mu mutex[lkEtcdSync]
	// written is what etcd confirmed, by key, under the current lease.
	written map[string]struct{}
	// maybe is what was put without an answer (an election, a cut): etcd
	// may hold it, so it is deleted if the node no longer wants it.
	maybe map[string]struct{}
	// behind is how many puts and deletes the last pass left to do.
	behind int
	// changed is closed (and replaced) whenever written changes.
	changed chan struct{}
	kick    chan struct{} // (capacity 1) something changed: reconcile
	verify  bool          // read the keys back on the next pass
	// verifiedHave is the keys the last read back found, for the pass
	// that read them.
	verifiedHave map[string]bool
	// passes counts the passes that ended; refused says the last one
	// found every member refusing connections (changed is closed when
	// either moves): a Spawn then stops waiting, since no answer is near.
	passes  uint64
	refused bool
}

func (s *etcdSync) init() {
	s.written = map[string]struct{}{}
	s.maybe = map[string]struct{}{}
	s.changed = make(chan struct{})
	s.kick = make(chan struct{}, 1)
}

// poke asks for a pass; verify also reads the node's keys back first.
func (s *etcdSync) poke(verify bool) {
	if verify {
		s.mu.Lock()
		s.verify = true
		s.mu.Unlock()
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// pending says how many of the node's puts and deletes etcd has not
// confirmed.
func (ec *etcdClient) etcdPending() int {
	if ec.reg == nil {
		return 0
	}
	s := &ec.sync
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.behind
}

// awaitEtcd waits until etcd holds the registration of the actor h
// (true), the actor is gone (true: nothing to wait for), or ctx ends. It
// also stops waiting (false) once a pass that ended after it began found
// every member refusing connections: an election answers within ctx, an
// etcd that is down does not.
func (ec *etcdClient) awaitEtcd(ctx context.Context, h *handle, reg Registration) bool {
	key := ec.reg.key(reg.Name, reg.UUID)
	s := &ec.sync
	s.mu.Lock()
	began := s.passes
	s.mu.Unlock()
	for {
		s.mu.Lock()
		_, ok := s.written[key]
		down := s.refused && s.passes > began
		ch := s.changed
		s.mu.Unlock()
		if ok || ec.n.actors.get(h.key.path, h.key.uuid) == nil {
			return true
		}
		if down {
			return false
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		case <-ec.n.lc.done:
			return false
		}
	}
}

// syncEtcd is the goroutine that writes the node's entries.
func (ec *etcdClient) syncEtcd() {
	s := &ec.sync
	verify := time.NewTicker(etcdVerifyEvery)
	defer verify.Stop()
	wait := time.Duration(0)
	var retry <-chan time.Time
	for {
		select {
		case <-ec.n.lc.done:
			return
		case <-s.kick:
		case <-verify.C:
			s.poke(true)
			continue
		case <-retry:
		}
		if ec.n.lc.isClosed() {
			return // (the lease is being revoked: nothing is put again)
		}
		retry = nil
		ctx, cancel := context.WithTimeout(ec.n.lc.ctx, ec.n.disc.registryTimeout())
		err := ec.reconcileEtcd(ctx)
		cancel()
		s.mu.Lock()
		s.passes++
		s.refused = errors.Is(err, errEtcdRefused)
		s.wake()
		s.mu.Unlock()
		if err == nil {
			if wait > 0 {
				ec.n.log.Info("troupe: the etcd registry holds this node's entries again", "registry", ec.reg.String())
			}
			wait = 0
			continue
		}
		if ec.n.lc.isClosed() {
			return
		}
		if wait == 0 {
			ec.n.log.Warn("troupe: could not update this node's entries in the etcd registry; trying again until it answers", "registry", ec.reg.String(), "pending", ec.etcdPending(), "err", err)
		}
		wait = min(max(2*wait, etcdRetryMin), etcdRetryMax)
		s.mu.Lock()
		s.verify = true // (an answer lost on the way: read back what was done)
		s.mu.Unlock()
		t := time.NewTimer(wait)
		retry = t.C
	}
}

// reconcileEtcd makes etcd hold the node's entries: what it wants and
// etcd has not confirmed is put, what etcd holds and it no longer wants
// is deleted; it goes on until nothing is left to do (the set may change
// while it works).
func (ec *etcdClient) reconcileEtcd(ctx context.Context) error {
	r, s := ec.reg, &ec.sync
	for {
		want := map[string]Registration{}
		for _, reg := range ec.n.disc.publicRegistrations() {
			want[r.key(reg.Name, reg.UUID)] = reg
		}
		s.mu.Lock()
		s.behind = diffCount(want, s.written) // (before a read back that may fail)
		verify := s.verify
		s.verify = false
		s.mu.Unlock()
		if verify {
			have, err := r.keys(ctx)
			if err != nil {
				s.mu.Lock()
				s.verify = true
				s.mu.Unlock()
				return err
			}
			s.mu.Lock()
			for k := range s.written {
				if !have[k] {
					delete(s.written, k) // lost (a member restarted without its data): put again
				}
			}
			s.verifiedHave = have
			s.mu.Unlock()
		}
		var ops []etcdOp
		s.mu.Lock()
		for k := range s.maybe {
			if _, ok := want[k]; !ok {
				ops = append(ops, etcdOp{key: k, del: true}) // (etcd may hold it)
			}
		}
		for k, reg := range want {
			if _, ok := s.written[k]; ok {
				continue
			}
			if s.verifiedHave[k] {
				s.written[k] = struct{}{} // a put whose answer was lost
				continue
			}
			ops = append(ops, etcdOp{key: k, reg: reg})
		}
		for k := range s.written {
			if _, ok := want[k]; !ok {
				ops = append(ops, etcdOp{key: k, del: true})
			}
		}
		s.verifiedHave = nil
		s.behind = len(ops)
		if len(ops) == 0 {
			s.wake() // (an Spawn may wait for an actor that is gone)
			s.mu.Unlock()
			return nil
		}
		s.mu.Unlock()
		lease := r.currentLease()
		for len(ops) > 0 {
			batch := ops[:min(len(ops), etcdTxnOps)]
			ops = ops[len(batch):]
			if err := r.txn(ctx, lease, batch); err != nil {
				s.mu.Lock()
				for _, op := range batch {
					if !op.del {
						s.maybe[op.key] = struct{}{}
					}
				}
				s.mu.Unlock()
				return err
			}
			s.mu.Lock()
			for _, op := range batch {
				delete(s.maybe, op.key)
				if op.del {
					delete(s.written, op.key)
				} else {
					s.written[op.key] = struct{}{}
				}
			}
			s.behind -= len(batch)
			s.wake()
			s.mu.Unlock()
		}
	}
}

// wake tells the waiters that written changed (mu held).
func (s *etcdSync) wake() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// diffCount is how many puts and deletes make written hold want.
func diffCount(want map[string]Registration, written map[string]struct{}) int {
	k := 0
	for key := range want {
		if _, ok := written[key]; !ok {
			k++
		}
	}
	for key := range written {
		if _, ok := want[key]; !ok {
			k++
		}
	}
	return k
}

// leaseLost forgets what etcd confirmed (it went with the lease) and has
// everything put again under the new lease.
func (ec *etcdClient) leaseLost() {
	s := &ec.sync
	s.mu.Lock()
	clear(s.written)
	clear(s.maybe) // (gone with the lease too)
	s.mu.Unlock()
	s.poke(false)
}

// etcdOp is a put of reg, or a delete, of one key.
type etcdOp struct {
	key string
	reg Registration
	del bool
}

// txn applies ops in one transaction, the puts under lease.
func (r *etcdRegistry) txn(ctx context.Context, lease string, ops []etcdOp) error {
	success := make([]map[string]any, 0, len(ops))
	for _, op := range ops {
		if op.del {
			success = append(success, map[string]any{"requestDeleteRange": map[string]any{"key": b64(op.key)}})
			continue
		}
		v, err := entryValue(op.reg)
		if err != nil {
			return err
		}
		success = append(success, map[string]any{"requestPut": map[string]any{"key": b64(op.key), "value": v, "lease": lease}})
	}
	var res struct{ Succeeded bool }
	if err := r.call(ctx, "/v3/kv/txn", map[string]any{"success": success}, &res); err != nil {
		return err
	}
	if !res.Succeeded {
		return fmt.Errorf("etcd %s: a transaction without conditions did not succeed", r.url)
	}
	return nil
}

// entryValue is the value of reg's key (base64, as the gateway takes it).
func entryValue(reg Registration) (string, error) {
	e := etcdEntry{Name: reg.Name, UUID: hex.EncodeToString(reg.UUID[:]), Path: reg.Path, Node: hex.EncodeToString(reg.Node[:]),
		NodeName: reg.NodeName, Registered: time.Now().UTC()}
	for _, a := range reg.Addrs {
		e.Addrs = append(e.Addrs, a.String())
	}
	v, err := json.Marshal(e)
	if err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(v), nil
}

// keys returns the keys under the registry's prefix (without values).
func (r *etcdRegistry) keys(ctx context.Context) (map[string]bool, error) {
	var res struct {
		Kvs []struct {
			Key string `json:"key"`
		}
	}
	req := map[string]any{"key": b64(r.prefix), "range_end": b64(rangeEnd(r.prefix)), "keys_only": true}
	if err := r.call(ctx, "/v3/kv/range", req, &res); err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(res.Kvs))
	for _, kv := range res.Kvs {
		k, err := base64.StdEncoding.DecodeString(kv.Key)
		if err == nil {
			out[string(k)] = true
		}
	}
	return out, nil
}
