//go:build linux

package hostnet

import (
	"bytes"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func TestRelayDelaysAndKeepsOrder(t *testing.T) {
	t.Parallel()
	nt := New(t, 2)
	// An echo server in host 1.
	var l net.Listener
	if err := inNamespace(nt.Hosts[1].Name, func() (err error) {
		l, err = net.Listen("tcp", nt.Hosts[1].IP.String()+":7100")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		io.Copy(c, c)
		c.Close()
	}()
	r := NewRelay(t, nt.Hosts[0], nt.Hosts[1].IP.String()+":7100", 50*time.Millisecond, 20*time.Millisecond)
	var c net.Conn
	if err := inNamespace(nt.Hosts[0].Name, func() (err error) {
		c, err = net.Dial("tcp", r.Addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := []byte(strings.Repeat("0123456789", 1000))
	start := time.Now()
	go func() {
		for i := 0; i < len(want); i += 500 {
			c.Write(want[i : i+500])
		}
	}()
	got := make([]byte, len(want))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the relay reordered or changed bytes")
	}
	if took := time.Since(start); took < 60*time.Millisecond { // two ways, each at least 30 ms
		t.Fatalf("a round trip through the relay took %v, want at least 60ms", took)
	}
}

func TestDropAndLinkDown(t *testing.T) {
	t.Parallel()
	nt := New(t, 2)
	a, b := nt.Hosts[0], nt.Hosts[1]
	var l net.Listener
	if err := inNamespace(b.Name, func() (err error) {
		l, err = net.Listen("tcp", b.IP.String()+":7200")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	reach := func() bool {
		err := inNamespace(a.Name, func() error {
			c, err := net.DialTimeout("tcp", b.IP.String()+":7200", 300*time.Millisecond)
			if err == nil {
				c.Close()
			}
			return err
		})
		return err == nil
	}
	// reaches waits for the link to carry a connection: after a change
	// the first packets may wait for the neighbour to be found again,
	// longer than one dial's timeout on a loaded machine.
	reaches := func() bool {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			if reach() {
				return true
			}
		}
		return false
	}
	if !reaches() {
		t.Fatal("a cannot reach b on a healthy network")
	}
	b.DropFrom(a)
	if reach() {
		t.Fatal("a reached b through a drop rule")
	}
	b.Clear()
	if !reaches() {
		t.Fatal("clearing the rules did not restore the link")
	}
	b.LinkDown()
	if reach() {
		t.Fatal("a reached b over a link that is down")
	}
	b.LinkUp()
	if !reaches() {
		t.Fatal("the link did not come back up")
	}
}
