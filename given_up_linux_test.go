//go:build linux

package troupe

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// socketsOn returns the TCP sockets (IPv4) whose local port is port and
// that are not listening, with their kernel states, from /proc/net/tcp:
// they include those a closed connection left to the kernel.
func socketsOn(t *testing.T, port int) []string {
	t.Helper()
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		t.Skipf("no /proc/net/tcp: %v", err)
	}
	defer f.Close()
	states := map[string]string{"01": "ESTABLISHED", "04": "FIN_WAIT1", "05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0B": "CLOSING"}
	var found []string
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || fields[3] == "0A" { // 0A: listening
			continue
		}
		_, hexPort, _ := strings.Cut(fields[1], ":")
		if p, err := strconv.ParseUint(hexPort, 16, 16); err == nil && int(p) == port {
			name := states[fields[3]]
			if name == "" {
				name = fields[3]
			}
			found = append(found, fmt.Sprintf("%s -> %s %s", fields[1], fields[2], name))
		}
	}
	return found
}

// A session this node gave up on, with a peer that reads nothing, leaves
// nothing behind: the node's goodbye cannot reach the peer, and a
// connection closed the ordinary way would stay in the kernel for
// minutes, holding what the peer never read behind a FIN that cannot go
// (and the peer's writes, blocked on a shut window, with it). The node
// resets it instead, byeGrace after giving up.
func TestAGivenUpPeerThatReadsNothingLeavesNoSocket(t *testing.T) {
	t.Parallel()
	slowTest(t)
	cfg := failConfig("n", 50*time.Millisecond, time.Second)
	cfg.Listen = []string{"tcp://127.0.0.1:0"}
	n := startNode(t, cfg)
	gone := make(chan PeerUnreachable, 1)
	SubscribeChan(n, gone)
	// A peer that handshakes, then neither reads nor says anything.
	c, uid := rawHandshakeWith(t, n, helloResumable)
	c.(*net.TCPConn).SetReadBuffer(4 << 10)
	var a *assoc
	waitFor(t, 5*time.Second, "the raw peer to be up", func() bool {
		n.peers.mu.Lock()
		defer n.peers.mu.Unlock()
		a = n.peers.byUID[uid]
		return a != nil
	})
	// More than the peer's window takes, less than the node's socket
	// buffer: the node's writer writes it all, and the kernel holds it.
	sink := Ref[testPong]{h: &handle{node: n, key: refKey{node: uid, path: "/user/sink"}, assoc: a}}
	big := testPong{From: strings.Repeat("x", 16<<10)}
	for i := range 12 {
		big.N = i
		sink.Tell(big)
	}
	_, portText, _ := strings.Cut(n.Addrs()[0].Address(), ":")
	port, _ := strconv.Atoi(portText)
	recv(t, gone, "the silent peer to be given up on")
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := socketsOn(t, port)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after giving up on a peer that reads nothing, the node's end of the connection is still in the kernel: %v", left)
		}
		time.Sleep(20 * time.Millisecond) // (polling the kernel's table: there is no event for it)
	}
}
