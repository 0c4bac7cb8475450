package troupe_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"troupe"
)

// registryStarter starts a registrar node and returns a function that
// starts quiet nodes registered with it; all close when t ends.
func registryStarter(t *testing.T) func(name string) *troupe.Node {
	t.Helper()
	cfg := quiet("registrar")
	cfg.RegistryAddrs = []string{"tcp://127.0.0.1:0"}
	registrar, err := troupe.Start(ctxFor(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { registrar.Close() })
	return func(name string) *troupe.Node {
		cfg := quiet(name, "tcp://127.0.0.1:0")
		cfg.RegistryAddrs = []string{registrar.Addrs()[0].String()}
		n, err := troupe.Start(ctxFor(t), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
}

// Any path a node lists among its actors (troupe actors prints them) may
// be resolved from another node without harm. A lookup that found an
// actor on a peer keeps a watcher at /system/$found…, which takes no
// messages: resolving it from a peer panicked the node's connection
// reader (it named a protocol the watcher does not have) and ended the
// process.
func TestResolvingALookupsWatcherFromAnotherNode(t *testing.T) {
	t.Parallel()
	start := registryStarter(t)
	service, finder := start("service"), start("finder")
	if _, err := troupe.Spawn(service, "echo", troupe.Behavior[string]{Receive: func(*troupe.Context[string], string) {}}); err != nil {
		t.Fatal(err)
	}
	if _, err := troupe.FindActor[string](ctxFor(t), finder, "echo"); err != nil {
		t.Fatalf("FindActor: %v", err)
	}
	doc, err := service.FetchStats(ctxFor(t), finder.Addrs()[0].String())
	if err != nil {
		t.Fatal(err)
	}
	var stats struct {
		Actors []struct{ Path string } `json:"actor_list"`
	}
	if err := json.Unmarshal(doc, &stats); err != nil {
		t.Fatal(err)
	}
	var watcher string
	for _, a := range stats.Actors {
		if strings.HasPrefix(a.Path, "/system/$found") {
			watcher = a.Path
		}
	}
	if watcher == "" {
		t.Fatalf("the finder lists no lookup watcher among %+v", stats.Actors)
	}
	_, err = troupe.Resolve[string](ctxFor(t), service, troupe.FormatRef(finder.Addrs()[0], watcher))
	if !errors.Is(err, troupe.ErrNoSuchActor) {
		t.Fatalf("Resolve of %s on the finder: %v, want ErrNoSuchActor", watcher, err)
	}
	if _, err := service.FetchStats(ctxFor(t), finder.Addrs()[0].String()); err != nil {
		t.Fatalf("the finder after the resolve: %v", err)
	}
	_, err = troupe.Resolve[string](ctxFor(t), finder, troupe.FormatRef(finder.Addrs()[0], watcher))
	if !errors.Is(err, troupe.ErrNoSuchActor) {
		t.Fatalf("Resolve of %s on the finder itself: %v, want ErrNoSuchActor", watcher, err)
	}
}
