package troupe_test

import (
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"troupe"
)

// The debug page shows what an operator acts on: the process's numbers,
// the actor tree with each child under its parent and its restarts, the
// recent dead letters with their type and reason, and the cluster's
// members with the self and leader marks; durations rounded.
func TestDebugPageShowsWhatAnOperatorActsOn(t *testing.T) {
	t.Parallel()
	slowTest(t)
	n, err := troupe.Start(ctxFor(t), troupe.Config{Name: "ops", Listen: []string{"tcp://127.0.0.1:0"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	c, err := troupe.StartCluster(ctxFor(t), n, troupe.ClusterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	// A second member, to show a peer's name, phi and round trip.
	n2, err := troupe.Start(ctxFor(t), troupe.Config{Name: "ops-two", Listen: []string{"tcp://127.0.0.1:0"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer n2.Close()
	if _, err := troupe.StartCluster(ctxFor(t), n2, troupe.ClusterConfig{Seeds: []string{n.Addrs()[0].String()}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "two members up", func() bool {
		up := 0
		for _, m := range c.Members() {
			if m.Status == troupe.MemberUp {
				up++
			}
		}
		return up == 2
	})
	// A parent with a child; the child fails once and is restarted.
	restarted := make(chan struct{}, 1)
	builds := 0
	child := func() troupe.Behavior[string] {
		builds++
		if builds == 2 {
			restarted <- struct{}{}
		}
		return troupe.Behavior[string]{Receive: func(c *troupe.Context[string], m string) { c.Fail(errors.New("bad input")) }}
	}
	ready := make(chan troupe.Ref[string], 1)
	if _, err := troupe.Spawn(n, "parent", troupe.Behavior[int]{
		Setup: func(c *troupe.Context[int]) {
			r, err := troupe.Spawn(c, "worker", troupe.Supervise(child, troupe.RestartOnFailure()))
			if err != nil {
				t.Error(err)
			}
			ready <- r
		},
		Receive: func(*troupe.Context[int], int) {},
	}); err != nil {
		t.Fatal(err)
	}
	worker := <-ready
	worker.Tell("fail")
	within(t, restarted, 10*time.Second, "the worker's restart")
	// A dead letter: a message to an actor that has stopped.
	gone, _ := troupe.Spawn(n, "gone", troupe.Behavior[int]{Receive: func(*troupe.Context[int], int) {}})
	n.Stop(gone)
	waitUntil(t, 10*time.Second, "a dead letter", func() bool { gone.Tell(7); return len(n.Stats().RecentDeadLetters) > 0 })

	var page string
	waitUntil(t, 10*time.Second, "the restart counted", func() bool {
		rec := httptest.NewRecorder()
		n.DebugHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/debug/troupe", nil))
		page = rec.Body.String()
		return strings.Contains(page, `data-path="/user/parent/worker"><td style="padding-left:3em">worker</td><td>/user/parent/worker</td><td>0</td><td class="bad">1</td>`)
	})
	for _, want := range []string{
		`id="runtime">troupe ` + troupe.Version,
		" goroutines · heap ",
		`data-path="/user/parent"><td style="padding-left:1em">parent</td>`,
		`<tr class="deadletter">`, "/user/gone</td><td>int</td>",
		`<td>` + n2.Addrs()[0].String() + `</td><td>ops-two</td>`, // (the other member, by name)
		"(member)</td>",
	} {
		if !strings.Contains(page, want) {
			t.Fatalf("the page lacks %q:\n%s", want, page)
		}
	}
	if m := regexp.MustCompile(`up \d+(\.\d+)?(µs|ms|s|m\d+(\.\d+)?s)`).FindString(page); m == "" || regexp.MustCompile(`up \d+\.\d{4,}`).MatchString(page) {
		t.Fatalf("the uptime is not rounded:\n%s", page)
	}
	self := regexp.MustCompile(`<tr class="member( leader)? self( leader)?"><td>` + regexp.QuoteMeta(n.Addrs()[0].String()) + `</td><td>ops</td>`)
	if !self.MatchString(page) || strings.Count(page, " leader\"") != 1 || !strings.Contains(page, "(this node)") {
		t.Fatalf("the members are not marked self and leader:\n%s", page)
	}
	if strings.Contains(page, "phi -0.00") || !regexp.MustCompile(`phi \d+\.\d\d<`).MatchString(page) {
		t.Fatalf("the page shows no phi, or phi -0.00:\n%s", page)
	}
	if regexp.MustCompile(`<td>\d+(\.\d+)?(ns|µs|ms|s)</td>`).FindString(page) != "" && regexp.MustCompile(`\d\.\d{4,}(µs|ms|s)<`).MatchString(page) {
		t.Fatalf("durations are not rounded:\n%s", page)
	}
}

// The tree puts each child right under its parent, whatever its siblings
// are called ("a-b" sorts between "a" and "a/x" as text), and what names
// carry is escaped: the page has no script, whatever a name holds.
func TestDebugPageTreeOrderAndEscaping(t *testing.T) {
	t.Parallel()
	n, err := troupe.Start(ctxFor(t), troupe.Config{Name: `<script>alert("x")</script>`, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	nop := troupe.Behavior[int]{Receive: func(*troupe.Context[int], int) {}}
	spawned := make(chan struct{})
	if _, err := troupe.Spawn(n, "a", troupe.Behavior[int]{Setup: func(c *troupe.Context[int]) {
		if _, err := troupe.Spawn(c, "x", nop); err != nil {
			t.Error(err)
		}
		close(spawned)
	}, Receive: nop.Receive}); err != nil {
		t.Fatal(err)
	}
	<-spawned
	for _, name := range []string{"a-b", "a.c"} {
		if _, err := troupe.Spawn(n, name, nop); err != nil {
			t.Fatal(err)
		}
	}
	rec := httptest.NewRecorder()
	n.DebugHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/debug/troupe", nil))
	page := rec.Body.String()
	a, x, ab := strings.Index(page, `data-path="/user/a"`), strings.Index(page, `data-path="/user/a/x"`), strings.Index(page, `data-path="/user/a-b"`)
	if a < 0 || x < 0 || ab < 0 || !(a < x && x < ab) {
		t.Fatalf("the child is not right under its parent (a %d, a/x %d, a-b %d):\n%s", a, x, ab, page)
	}
	if strings.Contains(strings.ToLower(page), "<script") {
		t.Fatalf("the page has a script:\n%s", page)
	}
}
