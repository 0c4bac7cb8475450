package troupe

import (
	"sync"
	"testing"
	"time"
)

// A Send queued as a record (the writer had not come back for the queue)
// that has no credit when the writer reaches it waits at the head of the
// queue, and every record behind it waits too: answers to the peer's
// requests among them. Those are held up by the peer's own slow actor,
// not by its reading: they count against SendQueueLimit, not the 1 MiB
// answer budget, and a peer that reads everything is not ended as one
// that does not (a review found it was: 5b6b8ad counted them).
func TestAnswersBehindACreditWaitDoNotEndAReadingPeer(t *testing.T) {
	t.Parallel()
	cfgB := testConfig("tcp://127.0.0.1:0")
	cfgB.MailboxLimit = 4
	a := startNode(t, testConfig("tcp://127.0.0.1:0"))
	b := startNode(t, cfgB)
	block := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(block) }) })
	if _, err := Spawn(b, "sink", Behavior[testPing]{Receive: func(*Context[testPing], testPing) { <-block }}); err != nil {
		t.Fatal(err)
	}
	spawnEcho(t, a, "echo")
	sink, err := Resolve[testPing](ctxT(t, 5*time.Second), a, FormatRef(b.Addrs()[0], "/user/sink"))
	if err != nil {
		t.Fatal(err)
	}
	echoFromB, err := Resolve[testPing](ctxT(t, 5*time.Second), b, FormatRef(a.Addrs()[0], "/user/echo"))
	if err != nil {
		t.Fatal(err)
	}
	protocol := make(chan ProtocolError, 1)
	SubscribeChan(a, protocol)
	sink.Tell(testPing{N: 0}) // defines the target; the sink blocks on it
	// Ten Sends queued as records behind a round the writer has not come
	// back for yet (as send does when !encodesNow): credit is checked
	// when they are encoded, so more than the sink's credit get in.
	as := sink.h.assoc
	tg := as.lockTarget()
	tg.queue.push(outRec{msg: ctlFrame(appendResolve(nil, resolveBody{id: 1 << 40, path: "/user/none", proto: "p"}))})
	for i := range 10 {
		m := testPing{N: i + 1}
		tg.queue.push(outRec{h: sink.h, msg: m, mt: typeOfValue(m), wait: true})
	}
	queued := tg.queue.len()
	tg.mu.Unlock()
	as.notify()
	var left int
	waitFor(t, 5*time.Second, "the writer's round to take the records", func() bool {
		tg := as.lockTarget()
		defer tg.mu.Unlock()
		left = tg.queue.len()
		return left < queued
	})
	t.Logf("records queued %d, left after the writer's round %d", queued, left)
	// B asks A for answers, and reads everything A writes.
	bs := echoFromB.h.assoc
	body := appendResolve(nil, resolveBody{id: 0, path: "/user/none", proto: "p"})
	for i := range 70000 {
		body = appendResolve(body[:0], resolveBody{id: 1<<41 + uint64(i), path: "/user/none", proto: "p"})
		if !bs.control(body) {
			break
		}
	}
	select {
	case e := <-protocol:
		t.Fatalf("A ended its session with B, which reads everything, as a peer that does not read: %v", e.Err)
	case <-time.After(5 * time.Second):
	}
}
