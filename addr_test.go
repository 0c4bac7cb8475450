package troupe

import (
	"errors"
	"strings"
	"testing"
)

func TestParseAddrRoundTrip(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	tests := []struct {
		in, url, maddr string
	}{
		{"tcp://127.0.0.1:7001", "tcp://127.0.0.1:7001", "/ip4/127.0.0.1/tcp/7001"},
		{"127.0.0.1:1616", "tcp://127.0.0.1:1616", "/ip4/127.0.0.1/tcp/1616"},
		{"/ip4/127.0.0.1/tcp/1616", "tcp://127.0.0.1:1616", "/ip4/127.0.0.1/tcp/1616"},
		{"/ip6/::1/tcp/1616", "tcp://[::1]:1616", "/ip6/::1/tcp/1616"},
		{"tcp://[::1]:0", "tcp://[::1]:0", "/ip6/::1/tcp/0"},
		{"/dns/example.com/tcp/80", "tcp://example.com:80", "/dns/example.com/tcp/80"},
		{"tcp://localhost:9", "tcp://localhost:9", "/dns/localhost/tcp/9"},
		{"unix:///run/app/a.sock", "unix:///run/app/a.sock", "/unix/run/app/a.sock"},
		{"/unix/run/app/a.sock", "unix:///run/app/a.sock", "/unix/run/app/a.sock"},
	}
	for _, tt := range tests {
		a, err := ParseAddr(tt.in)
		if err != nil {
			t.Errorf("ParseAddr(%q) error: %v", tt.in, err)
			continue
		}
		if got := a.String(); got != tt.url {
			t.Errorf("ParseAddr(%q).String() = %q, want %q", tt.in, got, tt.url)
		}
		if got := a.multiaddr(); got != tt.maddr {
			t.Errorf("ParseAddr(%q).multiaddr() = %q, want %q", tt.in, got, tt.maddr)
		}
		for _, form := range []string{a.String(), a.multiaddr()} {
			b, err := ParseAddr(form)
			if err != nil || b != a {
				t.Errorf("ParseAddr(%q) = %v, %v; want %v", form, b, err, a)
			}
		}
	}
}

func TestParseAddrRejects(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	tests := []struct{ in, mention string }{
		{"", "empty"},
		{"/ip4/127.0.0.1/udp/1", `unsupported transport "udp"`},
		{"/ip4/::1/tcp/1", "not an IPv4"},
		{"/ip6/127.0.0.1/tcp/1", "not an IPv6"},
		{"/dns4/example.com/tcp/1", `unsupported protocol "dns4"`},
		{"/dns/127.0.0.1/tcp/1", "takes a name"},
		{"/quic/1", "unsupported protocol"},
		{"/ip4/127.0.0.1/tcp", "want /ip4/HOST/tcp/PORT"},
		{"/unix", "needs a path"},
		{"unix://relative.sock", "must be absolute"},
		{"http://x:1", `unsupported scheme "http"`},
		{"tcp://127.0.0.1:99999", "port"},
		{"tcp://127.0.0.1:http", "port"},
		{"tcp://:80", "empty host"},
		{"tcp://127.0.0.1", "missing port"},
		{"ip4/127.0.0.1/tcp/1", "missing port"},
		{"unix:///" + strings.Repeat("a", 200), "longer than 107"},
	}
	for _, tt := range tests {
		_, err := ParseAddr(tt.in)
		if !errors.Is(err, ErrBadAddr) || !strings.Contains(err.Error(), tt.mention) {
			t.Errorf("ParseAddr(%q) = %v; want ErrBadAddr mentioning %q", tt.in, err, tt.mention)
		}
	}
}

func FuzzParseAddr(f *testing.F) {
	for _, s := range []string{"tcp://127.0.0.1:1", "/ip6/::1/tcp/2", "/unix/a/b", "unix:///x", "/dns/a/tcp/3", "h:1", "troupe://1.2.3.4:5/user/x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAddr(s)
		if err != nil {
			if !errors.Is(err, ErrBadAddr) {
				t.Fatalf("ParseAddr(%q) error %v does not wrap ErrBadAddr", s, err)
			}
		} else {
			for _, form := range []string{a.String(), a.multiaddr()} {
				b, err := ParseAddr(form)
				if err != nil || b != a {
					t.Fatalf("ParseAddr(%q) = %v; its form %q parses to %v, %v", s, a, form, b, err)
				}
			}
		}
		if a, p, err := ParseRef(s); err == nil {
			a2, p2, err := ParseRef(FormatRef(a, p))
			if err != nil || a2 != a || p2 != p {
				t.Fatalf("ParseRef(%q) = %v %q; round trip gives %v %q %v", s, a, p, a2, p2, err)
			}
		}
	})
}

// compareAddr orders addresses as their String forms compare, which the
// members' order (lowerAddr) has always been.
func TestCompareAddrOrdersAsTheStrings(t *testing.T) {
	t.Parallel()
	addrs := []Addr{{}, tcpAddr("127.0.0.1:7001"), tcpAddr("127.0.0.1:701"), tcpAddr("[::1]:7001"),
		tcpAddr("10.0.0.2:1"), unixAddr("/run/a.sock"), unixAddr("/run/a"), unixAddr("/tmp/b.sock"),
		{network: "tcp4", address: "1.2.3.4:5"}, {network: "tc", address: "x"}, {network: "unix", address: ""}}
	for _, a := range addrs {
		for _, b := range addrs {
			if got, want := compareAddr(a, b), strings.Compare(a.String(), b.String()); got != want {
				t.Errorf("compareAddr(%q, %q) = %d, want %d", a, b, got, want)
			}
		}
	}
}
