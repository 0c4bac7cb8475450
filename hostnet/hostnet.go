//go:build linux

package hostnet

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// Net is a set of hosts joined by one bridge.
type Net struct {
	t      testing.TB
	prefix string // unique per Net, in every namespace and link name
	sw     string // the namespace holding the bridge
	subnet int    // third octet of 10.213.X.0/24

	mu    sync.Mutex
	Hosts []*Host
}

// Host is one network namespace on the bridge.
type Host struct {
	Name string     // the namespace
	IP   netip.Addr // its address on the bridge
	net  *Net
	port string // its veth end in the switch namespace
}

// Available reports why the harness cannot run here ("" if it can).
func Available() string {
	if os.Geteuid() != 0 {
		return "hostnet needs root to create network namespaces"
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "hostnet needs " + tool + " (apt-get install iproute2 nftables)"
		}
	}
	return ""
}

// New builds a network of n hosts, or skips the test when the harness
// cannot run here.
func New(t testing.TB, n int) *Net {
	t.Helper()
	if why := Available(); why != "" {
		t.Skip(why)
	}
	var b [3]byte
	rand.Read(b[:])
	nt := &Net{t: t, prefix: "tr" + hex.EncodeToString(b[:]), subnet: 1 + int(b[0])%250}
	nt.sw = nt.prefix + "sw"
	t.Cleanup(nt.close)
	nt.run("ip", "netns", "add", nt.sw)
	nt.run("ip", "-n", nt.sw, "link", "add", "br0", "type", "bridge")
	nt.run("ip", "-n", nt.sw, "link", "set", "br0", "up")
	for i := range n {
		h := &Host{Name: fmt.Sprintf("%sh%d", nt.prefix, i), net: nt, port: fmt.Sprintf("%sp%d", nt.prefix, i)}
		h.IP = netip.AddrFrom4([4]byte{10, 213, byte(nt.subnet), byte(i + 1)})
		nt.run("ip", "netns", "add", h.Name)
		nt.run("ip", "link", "add", h.port, "netns", nt.sw, "type", "veth", "peer", "name", "eth0", "netns", h.Name)
		nt.run("ip", "-n", nt.sw, "link", "set", h.port, "master", "br0", "up")
		nt.run("ip", "-n", h.Name, "addr", "add", h.IP.String()+"/24", "dev", "eth0")
		nt.run("ip", "-n", h.Name, "link", "set", "eth0", "up")
		nt.run("ip", "-n", h.Name, "link", "set", "lo", "up")
		nt.run("ip", "netns", "exec", h.Name, "nft", "add table inet hostnet")
		nt.run("ip", "netns", "exec", h.Name, "nft", "add chain inet hostnet in { type filter hook input priority 0 ; }")
		nt.Hosts = append(nt.Hosts, h)
	}
	return nt
}

func (nt *Net) run(args ...string) string {
	nt.t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		nt.t.Fatalf("hostnet: %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (nt *Net) close() {
	for _, h := range nt.Hosts {
		exec.Command("ip", "netns", "del", h.Name).Run()
	}
	exec.Command("ip", "netns", "del", nt.sw).Run()
}

// Command returns a command that runs inside host h's namespace.
func (h *Host) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", h.Name, name}, args...)...)
}

// LinkDown cuts h's link to the bridge: nothing reaches it or leaves it.
func (h *Host) LinkDown() { h.net.run("ip", "-n", h.net.sw, "link", "set", h.port, "down") }

// LinkUp restores h's link, and returns once both of its ends are up and
// the bridge forwards its traffic again (at most 10 s, else the test
// fails): a link that is still coming up is not yet a restored link.
func (h *Host) LinkUp() {
	h.net.t.Helper()
	h.net.run("ip", "-n", h.net.sw, "link", "set", h.port, "up")
	deadline := time.Now().Add(10 * time.Second)
	for {
		port := h.net.run("ip", "-n", h.net.sw, "-o", "link", "show", h.port)
		eth := h.net.run("ip", "-n", h.Name, "-o", "link", "show", "eth0")
		bridge := h.net.run("bridge", "-n", h.net.sw, "link", "show", "dev", h.port)
		if strings.Contains(port, "state UP") && strings.Contains(eth, "state UP") && strings.Contains(bridge, "state forwarding") {
			return
		}
		if time.Now().After(deadline) {
			h.net.t.Fatalf("hostnet: %s's link is not up 10 s after LinkUp:\n%s%s%s", h.Name, port, eth, bridge)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// nft runs an nft command in h's namespace.
func (h *Host) nft(rule string) { h.net.run("ip", "netns", "exec", h.Name, "nft", rule) }

// DropFrom drops, at h, every packet that comes from src: traffic src→h is
// cut while h→src still flows.
func (h *Host) DropFrom(src *Host) {
	h.nft(fmt.Sprintf("add rule inet hostnet in ip saddr %s drop", src.IP))
}

// Loss drops each packet arriving at h with the given probability, in
// percent.
func (h *Host) Loss(percent int) {
	h.nft(fmt.Sprintf("add rule inet hostnet in numgen random mod 100 < %d drop", percent))
}

// Clear removes every drop and loss rule at h.
func (h *Host) Clear() { h.nft("flush chain inet hostnet in") }

// Rules returns h's current nftables rules, for test logs.
func (h *Host) Rules() string {
	out, _ := exec.Command("ip", "netns", "exec", h.Name, "nft", "list", "chain", "inet", "hostnet", "in").CombinedOutput()
	return string(bytes.TrimSpace(out))
}
