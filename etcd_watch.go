package troupe

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
)

// Following etcd's changes: its watch stream under a prefix (watchFrom),
// and etcdSource, etcd as the registry lookups, waits and watches ask
// (see registries.go).

// watchFrom follows the keys under p from revision rev until an event
// that stop accepts (a delete, or a put of reg, ok when it decoded), the
// stream ends, or ctx ends. When etcdWatchRenew passes it returns nil (the
// caller reads and watches again), so that an error always means that
// etcd failed.
func (r *etcdRegistry) watchFrom(outer context.Context, p string, rev uint64, stop func(deleted bool, reg Registration, ok bool) bool) (err error) {
	ctx, cancel := context.WithTimeout(outer, etcdWatchRenew)
	defer cancel()
	defer func() {
		if err != nil && outer.Err() == nil && ctx.Err() != nil {
			err = nil // renewed, not failed
		}
	}()
	r.mu.Lock()
	endpoint := r.endpoints[r.first]
	r.mu.Unlock()
	body, _ := json.Marshal(map[string]any{"create_request": map[string]any{
		"key": b64(p), "range_end": b64(rangeEnd(p)), "start_revision": strconv.FormatUint(rev, 10)}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint+"/v3/watch", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := r.client.Do(req)
	if err != nil {
		r.rotate(endpoint)
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		r.rotate(endpoint)
		return fmt.Errorf("etcd watch: %s", resp.Status)
	}
	dec := json.NewDecoder(bufio.NewReader(resp.Body))
	for {
		var msg struct {
			Result struct {
				Canceled bool
				Events   []struct {
					Type string
					Kv   etcdKV
				}
			}
		}
		if err := dec.Decode(&msg); err != nil {
			if ctx.Err() == nil {
				r.rotate(endpoint)
			}
			return err
		}
		if msg.Result.Canceled {
			return errors.New("etcd watch canceled")
		}
		for _, ev := range msg.Result.Events {
			deleted := ev.Type == "DELETE"
			if reg, ok := r.decode(ev.Kv); stop(deleted, reg, ok && !deleted) {
				return nil
			}
		}
	}
}

// watch is Watch of an etcd registry: the table, then what differs
// each time etcd's watch stream reports a change under the registry's
// prefix, until ctx ends, the node closes or etcd does not answer.
func (s etcdSource) watch(ctx context.Context, each func(RegistryChange)) error {
	n, e := s.ec.n, s.r
	ctx, cancel := context.WithCancel(ctx)
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		select {
		case <-n.lc.workDone():
			cancel()
		case <-ctx.Done():
		}
	}()
	defer func() { cancel(); <-closed }()
	var seen map[regKey]Registration
	for {
		regs, rev, err := e.rangeOf(ctx, e.prefix)
		if err == nil {
			seen = etcdChange(seen, regs, each)
			err = e.watchFrom(ctx, e.prefix, rev+1, func(bool, Registration, bool) bool { return true })
		}
		switch {
		case n.lc.workOver():
			return ErrNodeClosed
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			return fmt.Errorf("%w: etcd %s: %v", ErrWatchLost, e, err)
		}
	}
}

// etcdChange passes each what regs, the table as read now, changes of
// seen (the table as last passed; nil: none yet, so the table is a
// Snapshot), and returns the table as it is now.
func etcdChange(seen map[regKey]Registration, regs []Registration, each func(RegistryChange)) map[regKey]Registration {
	now := make(map[regKey]Registration, len(regs))
	for _, reg := range regs {
		now[keyOf(&reg)] = reg
	}
	if seen == nil {
		each(RegistryChange{Snapshot: true, Added: regs})
		return now
	}
	var c RegistryChange
	for k, old := range seen {
		if reg, ok := now[k]; !ok || !sameRegistration(&old, &reg) {
			c.Removed = append(c.Removed, old)
		}
	}
	for _, reg := range regs {
		if old, ok := seen[keyOf(&reg)]; !ok || !sameRegistration(&old, &reg) {
			c.Added = append(c.Added, reg)
		}
	}
	if len(c.Added)+len(c.Removed) > 0 {
		slices.SortFunc(c.Removed, func(a, b Registration) int { return cmp.Compare(a.Seq, b.Seq) })
		each(c)
	}
	return now
}

// etcdSource is an etcd registry as lookups, waits and watches ask it
// (see registries.go): ec is the node's etcd client.
type etcdSource struct {
	ec *etcdClient
	r  *etcdRegistry
}

func (s etcdSource) String() string { return s.r.String() }
func (s etcdSource) addr() Addr     { return Addr{} }
func (s etcdSource) isLocal() bool  { return false }

// register has the node's one writer put r, and waits for it, boundedly.
// The node registers only with its own etcd (registrationTargets picks
// it); an etcd a lookup named is not written to.
func (s etcdSource) register(h *handle, r Registration) error {
	if s.r != s.ec.reg {
		return fmt.Errorf("troupe: %s is not this node's registry: a node registers only with its own", s.r)
	}
	s.ec.putEntry(h, r)
	return nil
}

// unregister has the node's one writer delete the entry (it writes what
// the node holds), when s is the node's own etcd.
func (s etcdSource) unregister(string, UUID) {
	if s.r == s.ec.reg {
		s.ec.sync.poke(false)
	}
}

func (s etcdSource) ask(ctx context.Context, req regRequest) ([]Registration, error) {
	return s.ec.askEtcd(ctx, s.r, req)
}

func (s etcdSource) deleteAddr(ctx context.Context, node NodeUID, addr Addr) {
	s.r.deleteAddr(ctx, node, addr)
}

// park waits on a goroutine of the node's, which ends with wctx; what it
// found is in w.found before w.p completes.
func (s etcdSource) park(_, wctx context.Context, w *regWaiter) ([]Registration, error) {
	c := w.cond
	s.ec.n.wg.Go(func() {
		regs, err := s.r.wait(wctx, w.name, c)
		w.found = regs
		w.p.complete(regReply{}, err)
	})
	return nil, nil
}

// repark: an etcd wait follows the store itself.
func (s etcdSource) repark(context.Context, *regWaiter) {}
func (s etcdSource) unpark(*regWaiter)                  {}

func (s etcdSource) answer(w *regWaiter, _ regReply) []Registration { return w.found }

// follow reads the registrations sel picks, delivers them, and waits on
// etcd's watch stream for the next change among them (a put or a
// delete), until ctx ends or the stream breaks.
func (s etcdSource) follow(ctx context.Context, sel regSelector, set func([]Registration), answered func()) error {
	r := s.r
	p := sel.etcdPrefix(r)
	for {
		regs, rev, err := r.rangeOf(ctx, p)
		if err != nil {
			return err
		}
		set(slices.DeleteFunc(regs, func(reg Registration) bool { return !sel.match(reg.Name) }))
		answered()
		err = r.watchFrom(ctx, p, rev+1, func(bool, Registration, bool) bool { return true })
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			return err
		}
	}
}

// etcdPrefix is where the selected registrations' keys start in r.
func (s regSelector) etcdPrefix(r *etcdRegistry) string {
	if s.name != "" {
		return r.prefix + s.name + "/"
	}
	return r.prefix + s.prefix
}
