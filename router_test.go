package troupe_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"troupe"
)

// routeAll asks the router for each key 0..keys-1 and returns which
// worker answered each.
func routeAll(t *testing.T, router troupe.Ref[job], keys int) []string {
	t.Helper()
	out := make([]string, keys)
	for k := range keys {
		got, err := troupe.Ask(ctxFor(t), router, func(reply troupe.Ref[string]) job { return job{N: k, Reply: reply} })
		if err != nil {
			t.Fatalf("key %d: %v", k, err)
		}
		out[k], _, _ = strings.Cut(got, ":")
	}
	return out
}

// A consistent-hash router sends a key to the same worker while the set
// is stable; when one worker of ten stops, only its keys move (about a
// tenth), spread over the others.
func TestConsistentHashMovesOnlyTheKeysOfALeavingRoutee(t *testing.T) {
	t.Parallel()
	slowTest(t)
	_, ns := serviceNodes(t, "a", "b", "c", "client")
	var workers []troupe.Ref[job]
	for i := range 10 {
		workers = append(workers, spawnWorker(t, ns[i%3], fmt.Sprintf("w%d", i)))
	}
	client := ns[3]
	router, err := troupe.SpawnGroupRouter(client, "by-key", workersKey, troupe.ConsistentHash(func(j job) string { return fmt.Sprint(j.N) }))
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the router to see ten workers", func() bool {
		seen := map[string]bool{}
		for _, w := range routeAllQuick(t, router, 200) {
			seen[w] = true
		}
		return len(seen) == 10
	})
	const keys = 1000
	before := routeAll(t, router, keys)
	if again := routeAll(t, router, keys); !slices.Equal(before, again) {
		t.Fatal("the same keys went to other workers while the set was stable")
	}
	owned := 0
	for _, w := range before {
		if w == "w3" {
			owned++
		}
	}
	ns[0].Stop(workers[3])
	var after []string
	waitUntil(t, 10*time.Second, "the router to drop w3", func() bool {
		after = routeAllQuick(t, router, keys)
		return after != nil
	})
	moved := 0
	for k := range keys {
		if before[k] == after[k] {
			continue
		}
		moved++
		if before[k] != "w3" {
			t.Fatalf("key %d moved from %s, which did not leave, to %s", k, before[k], after[k])
		}
	}
	t.Logf("one routee of ten left: %d of %d keys moved (it had %d)", moved, keys, owned)
	if moved != owned || owned < 50 || owned > 200 {
		t.Fatalf("%d keys moved; the leaving routee had %d of %d", moved, owned, keys)
	}
}

// routeAllQuick is routeAll that gives up (nil) at the first key that
// gets no answer within a second (a stopped routee still listed).
func routeAllQuick(t *testing.T, router troupe.Ref[job], keys int) []string {
	t.Helper()
	out := make([]string, keys)
	for k := range keys {
		ctx, cancel := contextWithTimeout(time.Second)
		got, err := troupe.Ask(ctx, router, func(reply troupe.Ref[string]) job { return job{N: k, Reply: reply} })
		cancel()
		if err != nil {
			return nil
		}
		out[k], _, _ = strings.Cut(got, ":")
	}
	return out
}

// Round-robin spreads messages evenly; random reaches every routee.
func TestRoundRobinAndRandomRouters(t *testing.T) {
	t.Parallel()
	slowTest(t)
	_, ns := serviceNodes(t, "a", "b", "client")
	for i := range 3 {
		spawnWorker(t, ns[i%2], fmt.Sprintf("w%d", i))
	}
	client := ns[2]
	for _, tc := range []struct {
		name     string
		strategy troupe.RouteStrategy[job]
	}{{"rr", troupe.RoundRobin[job]()}, {"random", troupe.RandomRoute[job]()}} {
		router, err := troupe.SpawnGroupRouter(client, tc.name, workersKey, tc.strategy)
		if err != nil {
			t.Fatal(err)
		}
		var counts map[string]int
		waitUntil(t, 10*time.Second, tc.name+": every routee reached", func() bool {
			counts = map[string]int{}
			for _, w := range routeAllQuick(t, router, 300) {
				counts[w]++
			}
			return len(counts) == 3
		})
		if tc.name == "rr" {
			counts = map[string]int{} // (the set is stable now)
			for _, w := range routeAll(t, router, 300) {
				counts[w]++
			}
			for w, c := range counts {
				if c != 100 {
					t.Fatalf("round-robin: %s got %d of 300 (%v)", w, c, counts)
				}
			}
		}
	}
}

// A router with no routee makes a dead letter that says so.
// A message sent the moment SpawnGroupRouter returns reaches a routee
// registered before it: the router takes its first message once it has
// its first listing, not before (it made a dead letter with ErrNoRoutee
// while the listing was on its way).
func TestARouterRoutesItsFirstMessageToARouteeRegisteredBefore(t *testing.T) {
	t.Parallel()
	// A node that is its own registrar, as a first program's is.
	cfg := quiet("client", "tcp://127.0.0.1:0")
	cfg.RegistryAddrs = []string{"tcp://127.0.0.1:0"}
	client, err := troupe.Start(ctxFor(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	dead := make(chan troupe.DeadLetter, 4)
	troupe.SubscribeChan(client, dead)
	key := troupe.ServiceKey[job]{Name: "early"}
	got := make(chan int, 4)
	worker, err := troupe.Spawn(client, "early-worker", troupe.Behavior[job]{Receive: func(_ *troupe.Context[job], j job) { got <- j.N }})
	if err != nil {
		t.Fatal(err)
	}
	if err := key.Register(client, worker); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		router, err := troupe.SpawnGroupRouter(client, fmt.Sprint("early-", i), key, troupe.ConsistentHash(func(j job) string { return fmt.Sprint(j.N) }))
		if err != nil {
			t.Fatal(err)
		}
		router.Tell(job{N: i})
		select {
		case n := <-got:
			if n != i {
				t.Fatalf("the worker got job %d, want %d", n, i)
			}
		case d := <-dead:
			t.Fatalf("router %d's first message: dead letter %+v", i, d)
		case <-time.After(10 * time.Second):
			t.Fatalf("router %d's first message never arrived", i)
		}
	}
}

// A router on a node without a registry has no listing to wait for: its
// first message is a dead letter at once, not after RegistryTimeout (five
// minutes here, past the stretched wait below).
func TestARouterWithoutARegistryDoesNotWaitForAListing(t *testing.T) {
	t.Parallel()
	cfg := quiet("alone", "tcp://127.0.0.1:0")
	cfg.RegistryTimeout = 5 * time.Minute
	n, err := troupe.Start(ctxFor(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	dead := make(chan troupe.DeadLetter, 4)
	troupe.SubscribeChan(n, dead)
	router, err := troupe.SpawnGroupRouter(n, "r", troupe.ServiceKey[job]{Name: "nobody"}, troupe.RoundRobin[job]())
	if err != nil {
		t.Fatal(err)
	}
	router.Tell(job{N: 1})
	if d := within(t, dead, 30*time.Second, "a dead letter"); !errors.Is(d.Reason, troupe.ErrNoRoutee) {
		t.Fatalf("dead letter %+v, want ErrNoRoutee", d)
	}
}

func TestARouterWithNoRouteeMakesADeadLetter(t *testing.T) {
	t.Parallel()
	_, ns := serviceNodes(t, "client")
	client := ns[0]
	dead := make(chan troupe.DeadLetter, 4)
	troupe.SubscribeChan(client, dead)
	router, err := troupe.SpawnGroupRouter(client, "none", troupe.ServiceKey[job]{Name: "nobody"}, troupe.RoundRobin[job]())
	if err != nil {
		t.Fatal(err)
	}
	router.Tell(job{N: 1})
	d := within(t, dead, 10*time.Second, "a dead letter")
	if !errors.Is(d.Reason, troupe.ErrNoRoutee) {
		t.Fatalf("dead letter %+v, want ErrNoRoutee", d)
	}
	if _, err := troupe.SpawnGroupRouter(client, "bad", troupe.ServiceKey[job]{Name: "no good"}, troupe.RoundRobin[job]()); !errors.Is(err, troupe.ErrBadName) {
		t.Fatalf("a bad key: %v, want ErrBadName", err)
	}
}

// A strategy that cannot choose (the zero RouteStrategy, or a consistent
// hash without its key function) is refused when the router is spawned,
// rather than panicking in the router at its first message; the name
// stays free.
func TestARouterWithoutAStrategyIsRefused(t *testing.T) {
	t.Parallel()
	_, ns := serviceNodes(t, "client")
	client := ns[0]
	for _, tc := range []struct {
		what     string
		strategy troupe.RouteStrategy[job]
	}{
		{"the zero strategy", troupe.RouteStrategy[job]{}},
		{"ConsistentHash(nil)", troupe.ConsistentHash[job](nil)},
	} {
		if _, err := troupe.SpawnGroupRouter(client, "router", workersKey, tc.strategy); !errors.Is(err, troupe.ErrBadConfig) {
			t.Fatalf("%s: SpawnGroupRouter = %v, want ErrBadConfig", tc.what, err)
		}
	}
	if _, err := troupe.SpawnGroupRouter(client, "router", workersKey, troupe.RoundRobin[job]()); err != nil {
		t.Fatalf("the name after two refusals: %v", err)
	}
}

func contextWithTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}
