package troupe

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// etcdLease is a [Lease] kept in etcd, reached through etcd's JSON gateway
// with net/http (no etcd Go module): the holder is the owner of a key bound
// to an etcd lease that a keep-alive goroutine renews every TTL/3.
type etcdLease struct {
	endpoint string // e.g. "http://127.0.0.1:2379"
	key      string
	ttl      time.Duration
	client   *http.Client

	mu      mutex[lkEtcdLease]
	owner   string
	leaseID string
	until   time.Time // when etcd expires it at the latest, counted from the asking
	lost    chan struct{}
	stop    chan struct{}
	wg      sync.WaitGroup // the keep-alive goroutine
}

var _ Lease = (*etcdLease)(nil)

// NewEtcdLease returns a [Lease] on key in the etcd at endpoint, with the
// given time to live (at least one second; etcd counts in seconds),
// reached through etcd's JSON gateway with net/http (no etcd Go module):
// the holder is the owner of a key bound to an etcd lease that a
// keep-alive goroutine renews every ttl/3. It returns the function that
// closes it, as context.WithCancel returns its cancel: call it when done;
// it releases the lease if held and waits for the keep-alive to stop.
// CheckHeld reports a lease held through this client until a fifth of the
// ttl before etcd may expire it.
func NewEtcdLease(endpoint, key string, ttl time.Duration) (Lease, func() error) {
	l := newEtcdLease(endpoint, key, ttl)
	return l, l.Close
}

func newEtcdLease(endpoint, key string, ttl time.Duration) *etcdLease {
	return &etcdLease{endpoint: endpoint, key: key, ttl: max(ttl, time.Second),
		client: &http.Client{Timeout: 5 * time.Second}, lost: make(chan struct{})}
}

func (l *etcdLease) post(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.endpoint+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := l.client.Do(req)
	if err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("troupe: etcd %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// Acquire takes the key for owner if nobody holds it (or owner already
// does), binding it to a fresh etcd lease that is then kept alive.
func (l *etcdLease) Acquire(ctx context.Context, owner string) (bool, error) {
	if l.CheckHeld(owner) {
		return true, nil
	}
	var grant struct{ ID string }
	asked := time.Now()
	if err := l.post(ctx, "/v3/lease/grant", map[string]any{"TTL": int64(l.ttl / time.Second)}, &grant); err != nil {
		return false, err
	}
	txn := map[string]any{
		"compare": []any{map[string]any{"key": b64(l.key), "target": "CREATE", "create_revision": "0", "result": "EQUAL"}},
		"success": []any{map[string]any{"request_put": map[string]any{"key": b64(l.key), "value": b64(owner), "lease": grant.ID}}},
		"failure": []any{map[string]any{"request_range": map[string]any{"key": b64(l.key)}}},
	}
	var res struct {
		Succeeded bool
		Responses []struct {
			ResponseRange struct {
				Kvs []struct{ Value string }
			} `json:"response_range"`
		}
	}
	if err := l.post(ctx, "/v3/kv/txn", txn, &res); err != nil {
		return false, err
	}
	if !res.Succeeded {
		l.post(ctx, "/v3/lease/revoke", map[string]any{"ID": grant.ID}, &struct{}{})
		return false, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.owner, l.leaseID, l.until = owner, grant.ID, asked.Add(l.ttl.Truncate(time.Second))
	l.stop = make(chan struct{})
	stop := l.stop
	l.wg.Go(func() { l.keepAlive(owner, grant.ID, stop) })
	return true, nil
}

func (l *etcdLease) keepAlive(owner, id string, stop chan struct{}) {
	keepLeaseAlive(l.ttl, stop, nil, func(ctx context.Context) (bool, error) {
		var res struct {
			Result struct{ TTL string }
		}
		asked := time.Now()
		err := l.post(ctx, "/v3/lease/keepalive", map[string]any{"ID": id}, &res)
		ttl, _ := strconv.Atoi(res.Result.TTL)
		if err == nil && ttl > 0 {
			l.mu.Lock()
			if l.owner == owner {
				l.until = asked.Add(time.Duration(ttl) * time.Second)
			}
			l.mu.Unlock()
		}
		return ttl > 0, err
	}, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.owner == owner {
			l.owner, l.leaseID = "", ""
			close(l.lost)
			l.lost = make(chan struct{})
		}
	})
}

// Release revokes the etcd lease (which deletes the key) and stops the
// keep-alive.
func (l *etcdLease) Release(ctx context.Context, owner string) error {
	l.mu.Lock()
	if l.owner != owner {
		l.mu.Unlock()
		return nil
	}
	id, stop := l.leaseID, l.stop
	l.owner, l.leaseID = "", ""
	l.mu.Unlock()
	close(stop)
	l.wg.Wait()
	return l.post(ctx, "/v3/lease/revoke", map[string]any{"ID": id}, &struct{}{})
}

// Close releases the lease if held and waits for the keep-alive to stop.
func (l *etcdLease) Close() error {
	l.mu.Lock()
	owner := l.owner
	l.mu.Unlock()
	if owner == "" {
		l.wg.Wait()
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return l.Release(ctx, owner)
}

// CheckHeld reports whether owner holds the lease through this client.
func (l *etcdLease) CheckHeld(owner string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return owner != "" && l.owner == owner && heldUntil(l.until, l.ttl)
}

// heldUntil reports whether a lease that expires at until at the latest
// still counts as held: not within a fifth of its ttl of expiring, so that
// a holder stops relying on it before anyone else can be granted it.
func heldUntil(until time.Time, ttl time.Duration) bool {
	return heldUntilAt(until, ttl, time.Now())
}

// heldUntilAt is heldUntil at now (the cluster simulator's clock).
func heldUntilAt(until time.Time, ttl time.Duration, now time.Time) bool {
	return now.Before(until.Add(-ttl / 5))
}

// Lost returns a channel closed when the held lease is lost.
func (l *etcdLease) Lost() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}
