package troupe

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"os"
	"testing"
	"time"
)

// etcdEndpoint returns the etcd to test against, or skips: .ci/run starts
// one and sets TROUPE_ETCD_ENDPOINT.
func etcdEndpoint(t *testing.T) string {
	ep := os.Getenv("TROUPE_ETCD_ENDPOINT")
	if ep == "" {
		ep = "http://127.0.0.1:2379"
	}
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(ep + "/version")
	if err != nil {
		t.Skipf("no etcd reachable at %s (set TROUPE_ETCD_ENDPOINT; .ci/run starts one): %v", ep, err)
	}
	resp.Body.Close()
	return ep
}

func freshKey() string {
	b := make([]byte, 6)
	rand.Read(b)
	return "troupe-test/" + hex.EncodeToString(b)
}

func TestEtcdLease(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	ep := etcdEndpoint(t)
	key := freshKey()
	a, b := newEtcdLease(ep, key, time.Second), newEtcdLease(ep, key, time.Second)
	defer a.Close()
	defer b.Close()
	ctx := ctxT(t, 10*time.Second)
	if ok, err := a.Acquire(ctx, "a"); !ok || err != nil {
		t.Fatalf("a: %v %v", ok, err)
	}
	time.Sleep(2500 * time.Millisecond) // beyond the TTL: the keep-alive must hold it
	if ok, err := b.Acquire(ctx, "b"); ok || err != nil {
		t.Fatalf("b acquired a held lease: %v %v", ok, err)
	}
	if err := a.Release(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.Acquire(ctx, "b"); !ok || err != nil {
		t.Fatalf("b after release: %v %v", ok, err)
	}
	// A release from an earlier owner, late (a cluster gives back a
	// lease lost in its hold when the hold ends), leaves b's alone.
	if err := a.Release(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	c := newEtcdLease(ep, key, time.Second)
	defer c.Close()
	if ok, err := c.Acquire(ctx, "c"); ok || err != nil || !b.CheckHeld("b") {
		t.Fatalf("after a late release by a: c acquired %v (%v), b holds %v; want b to keep it", ok, err, b.CheckHeld("b"))
	}
	// Revoked behind its back: the holder learns it lost the lease.
	lost := b.Lost()
	b.mu.Lock()
	id := b.leaseID
	b.mu.Unlock()
	b.post(context.Background(), "/v3/lease/revoke", map[string]any{"ID": id}, &struct{}{})
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("a revoked lease was not reported lost")
	}
	if b.CheckHeld("b") {
		t.Fatal("CheckHeld after the loss")
	}
}

func TestClusterLeaseMajorityWithEtcd(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	ep := etcdEndpoint(t)
	key := freshKey()
	r := &clusterRig{t: t, f: new(FaultNet)}
	r.addLeaseMembers(func(i int, _ *Node) Lease {
		endpoint := ep
		if i == 1 {
			endpoint = "http://127.0.0.1:1" // member 1 cannot reach etcd
		}
		lease := newEtcdLease(endpoint, key, time.Second)
		t.Cleanup(func() { lease.Close() })
		return lease
	})
	t.Cleanup(r.f.Heal)
	r.f.Partition(r.nodes[0], r.nodes[1])
	r.expectSurvivors(10*time.Second, 0)
}
