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
// and Registry.Watch of an etcd registry on it.

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

// watchEtcd is Watch of an etcd registry: the table, then what differs
// each time etcd's watch stream reports a change under the registry's
// prefix, until ctx ends, the node closes or etcd does not answer.
func (r *Registry) watchEtcd(ctx context.Context, each func(RegistryChange)) error {
	n, e := r.n, r.src.etcd
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
