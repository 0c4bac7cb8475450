package troupe

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// ErrBadAddr is returned (wrapped) by [ParseAddr] and [ParseRef] when a string is not an address troupe can use. The wrapping
// error names the input and the problem.
var ErrBadAddr = errors.New("troupe: bad address")

// Addr is a transport address a node listens on or dials: a TCP host and
// port, or the path of a Unix domain socket. The zero Addr is not an address.
//
// Addr is a small comparable value; two Addrs are equal when they name the
// same transport and the same text.
type Addr struct {
	network string // "tcp" or "unix"
	address string // "host:port" for tcp, an absolute path for unix
}

// tcpAddr returns the TCP address hostport ("127.0.0.1:7001", "[::1]:0").
// It panics if hostport is not a valid host and numeric port.
func tcpAddr(hostport string) Addr {
	a, err := parseHostPort(hostport)
	if err != nil {
		panic(err)
	}
	return a
}

// unixAddr returns the Unix domain socket address at path, which must be
// absolute. It panics otherwise.
func unixAddr(path string) Addr {
	a, err := parseUnixPath(path)
	if err != nil {
		panic(err)
	}
	return a
}

// Network returns "tcp" or "unix", the network name [net.Dial] expects, or ""
// for the zero Addr.
func (a Addr) Network() string { return a.network }

// Address returns the host:port of a TCP address or the path of a Unix one.
func (a Addr) Address() string { return a.address }

// IsZero reports whether a is the zero Addr.
func (a Addr) IsZero() bool { return a.network == "" }

// isUnix reports whether a is a Unix domain socket address.
func (a Addr) isUnix() bool { return a.network == "unix" }

// String returns the URL form: "tcp://127.0.0.1:7001" or
// "unix:///run/app/a.sock". [ParseAddr] reads it back exactly.
func (a Addr) String() string {
	if a.IsZero() {
		return ""
	}
	return a.network + "://" + a.address
}

// compareAddr orders a and b as strings.Compare orders their String
// forms, without building them.
func compareAddr(a, b Addr) int {
	if a.network == b.network {
		return strings.Compare(a.address, b.address)
	}
	// The networks differ, so the forms differ within the shorter
	// "network://": no network name holds a ':'. The zero Addr's form is
	// "", before every other.
	if a.IsZero() || b.IsZero() {
		return cmpBool(b.IsZero(), a.IsZero())
	}
	at := func(n string, i int) byte {
		if i < len(n) {
			return n[i]
		}
		return "://"[i-len(n)]
	}
	for i := 0; i < len(a.network)+3 && i < len(b.network)+3; i++ {
		if x, y := at(a.network, i), at(b.network, i); x != y {
			return cmpBool(x > y, x < y)
		}
	}
	return strings.Compare(a.String(), b.String())
}

// cmpBool is 1 when gt, -1 when lt, else 0.
func cmpBool(gt, lt bool) int {
	switch {
	case gt:
		return 1
	case lt:
		return -1
	}
	return 0
}

// multiaddr returns the libp2p-style form: "/ip4/127.0.0.1/tcp/1616",
// "/ip6/::1/tcp/1616", "/dns/example.com/tcp/80" or "/unix/run/app/a.sock".
// ParseAddr reads it back exactly.
func (a Addr) multiaddr() string {
	switch a.network {
	case "unix":
		return "/unix" + a.address
	case "tcp":
		host, port, _ := net.SplitHostPort(a.address)
		proto := "dns"
		if ip, err := netip.ParseAddr(host); err == nil {
			proto = "ip6"
			if ip.Is4() {
				proto = "ip4"
			}
		}
		return "/" + proto + "/" + host + "/tcp/" + port
	}
	return ""
}

// isLoopback reports whether a is a TCP address on a loopback IP or
// "localhost".
func (a Addr) isLoopback() bool {
	if a.network != "tcp" {
		return false
	}
	host, _, _ := net.SplitHostPort(a.address)
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// ParseAddr parses an address in any form troupe prints or accepts:
// "tcp://HOST:PORT", "unix:///abs/path", a multiaddr ("/ip4/…/tcp/…",
// "/ip6/…/tcp/…", "/dns/…/tcp/…", "/unix/abs/path"), or a bare "HOST:PORT",
// which means TCP. Errors wrap [ErrBadAddr] and say what is wrong.
func ParseAddr(s string) (Addr, error) {
	switch {
	case s == "":
		return Addr{}, fmt.Errorf("%w: empty string", ErrBadAddr)
	case strings.HasPrefix(s, "/"):
		return parseMultiaddr(s)
	case strings.HasPrefix(s, "tcp://"):
		return parseHostPort(strings.TrimPrefix(s, "tcp://"))
	case strings.HasPrefix(s, "unix://"):
		return parseUnixPath(strings.TrimPrefix(s, "unix://"))
	case strings.Contains(s, "://"):
		scheme, _, _ := strings.Cut(s, "://")
		return Addr{}, fmt.Errorf("%w: %q: unsupported scheme %q (want tcp or unix)", ErrBadAddr, s, scheme)
	}
	return parseHostPort(s)
}

// parseMultiaddr parses a libp2p-style multiaddr. Supported forms are
// /ip4/A/tcp/P, /ip6/A/tcp/P, /dns/NAME/tcp/P and /unix/PATH; anything else
// (udp, quic, dns4, p2p, …) is rejected with an error naming the part.
func parseMultiaddr(s string) (Addr, error) {
	if !strings.HasPrefix(s, "/") {
		return Addr{}, fmt.Errorf("%w: multiaddr %q must start with /", ErrBadAddr, s)
	}
	parts := strings.Split(s[1:], "/")
	switch parts[0] {
	case "unix":
		path := strings.TrimPrefix(s, "/unix")
		if path == "" {
			return Addr{}, fmt.Errorf("%w: multiaddr %q: /unix needs a path", ErrBadAddr, s)
		}
		return parseUnixPath(path)
	case "ip4", "ip6", "dns":
		if len(parts) != 4 {
			return Addr{}, fmt.Errorf("%w: multiaddr %q: want /%s/HOST/tcp/PORT", ErrBadAddr, s, parts[0])
		}
		host, proto, port := parts[1], parts[2], parts[3]
		if proto != "tcp" {
			return Addr{}, fmt.Errorf("%w: multiaddr %q: unsupported transport %q (only tcp)", ErrBadAddr, s, proto)
		}
		ip, err := netip.ParseAddr(host)
		switch {
		case parts[0] == "ip4" && (err != nil || !ip.Is4()):
			return Addr{}, fmt.Errorf("%w: multiaddr %q: %q is not an IPv4 address", ErrBadAddr, s, host)
		case parts[0] == "ip6" && (err != nil || !ip.Is6() || ip.Is4In6()):
			return Addr{}, fmt.Errorf("%w: multiaddr %q: %q is not an IPv6 address", ErrBadAddr, s, host)
		case parts[0] == "dns" && err == nil:
			return Addr{}, fmt.Errorf("%w: multiaddr %q: /dns takes a name, not the IP %q", ErrBadAddr, s, host)
		}
		return parseHostPort(net.JoinHostPort(host, port))
	default:
		return Addr{}, fmt.Errorf("%w: multiaddr %q: unsupported protocol %q (want ip4, ip6, dns or unix)", ErrBadAddr, s, parts[0])
	}
}

func parseHostPort(hostport string) (Addr, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		if ae, ok := errors.AsType[*net.AddrError](err); ok {
			err = errors.New(ae.Err) // (its Error repeats the address)
		}
		return Addr{}, fmt.Errorf("%w: %q: %v", ErrBadAddr, hostport, err)
	}
	if host == "" {
		return Addr{}, fmt.Errorf("%w: %q: empty host (use 0.0.0.0 or [::] for every interface)", ErrBadAddr, hostport)
	}
	if strings.ContainsAny(host, "%/ ") {
		return Addr{}, fmt.Errorf("%w: %q: unsupported host %q", ErrBadAddr, hostport, host)
	}
	if _, err := netip.ParseAddr(host); err != nil && strings.Contains(host, ":") {
		return Addr{}, fmt.Errorf("%w: %q: bad IPv6 host %q", ErrBadAddr, hostport, host)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || strconv.FormatUint(n, 10) != port {
		return Addr{}, fmt.Errorf("%w: %q: port %q is not a number from 0 to 65535", ErrBadAddr, hostport, port)
	}
	return Addr{network: "tcp", address: net.JoinHostPort(host, port)}, nil
}

func parseUnixPath(path string) (Addr, error) {
	switch {
	case path == "":
		return Addr{}, fmt.Errorf("%w: empty unix socket path", ErrBadAddr)
	case !strings.HasPrefix(path, "/"):
		return Addr{}, fmt.Errorf("%w: unix socket path %q must be absolute", ErrBadAddr, path)
	case strings.HasSuffix(path, "/"):
		return Addr{}, fmt.Errorf("%w: unix socket path %q names a directory", ErrBadAddr, path)
	case strings.ContainsRune(path, 0):
		return Addr{}, fmt.Errorf("%w: unix socket path %q contains NUL", ErrBadAddr, path)
	case len(path) > 107:
		return Addr{}, fmt.Errorf("%w: unix socket path %s is longer than 107 bytes (%d bytes)", ErrBadAddr, path, len(path))
	}
	return Addr{network: "unix", address: path}, nil
}

// FormatRef returns the string form of the actor at path on the node that
// listens on addr: "troupe://127.0.0.1:7001/user/worker" for TCP, and
// "troupe+unix://%2Frun%2Fa.sock/user/worker" for a Unix socket (the socket
// path is escaped into the host part). A path without its leading slash
// gets one ("worker" is "/worker"). [ParseRef] reads it back.
func FormatRef(addr Addr, path string) string {
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	if addr.isUnix() {
		return "troupe+unix://" + url.PathEscape(addr.address) + path
	}
	return "troupe://" + addr.address + path
}

// ParseRef splits a ref string made by [FormatRef] into the node address and
// the actor path. Errors wrap [ErrBadAddr].
func ParseRef(s string) (Addr, string, error) {
	var rest string
	var ok bool
	if rest, ok = strings.CutPrefix(s, "troupe+unix://"); ok {
		host, path, _ := strings.Cut(rest, "/")
		sock, err := url.PathUnescape(host)
		if err != nil {
			return Addr{}, "", fmt.Errorf("%w: ref %q: %v", ErrBadAddr, s, err)
		}
		a, err := parseUnixPath(sock)
		if err != nil {
			return Addr{}, "", fmt.Errorf("ref %q: %w", s, err)
		}
		p, err := checkRefPath(s, "/"+path)
		return a, p, err
	}
	if rest, ok = strings.CutPrefix(s, "troupe://"); !ok {
		return Addr{}, "", fmt.Errorf("%w: ref %q must start with troupe:// or troupe+unix://", ErrBadAddr, s)
	}
	if strings.Contains(rest, "://") {
		return Addr{}, "", fmt.Errorf("%w: ref %q holds a whole address (tcp://…, as Addr.String gives); build refs with FormatRef(addr, path)", ErrBadAddr, s)
	}
	host, path, _ := strings.Cut(rest, "/")
	a, err := parseHostPort(host)
	if err != nil {
		return Addr{}, "", fmt.Errorf("ref %q: %w (a ref is troupe://host:port/path; FormatRef builds one)", s, err)
	}
	p, err := checkRefPath(s, "/"+path)
	return a, p, err
}

func checkRefPath(ref, path string) (string, error) {
	if path == "/" || strings.HasSuffix(path, "/") || strings.Contains(path, "//") {
		return "", fmt.Errorf("%w: ref %q has no actor path", ErrBadAddr, ref)
	}
	return path, nil
}
