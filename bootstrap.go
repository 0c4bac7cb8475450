package troupe

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultRegistryTCP is the registry address of a node with discovery on
// and no [Config.RegistryAddrs].
const DefaultRegistryTCP = "127.0.0.1:1616"

// defaultRegistrySocket is the file name of the default Unix-socket
// registry, in the per-user runtime directory.
const defaultRegistrySocket = "registry@1616.sock"

// Probe limits of the bootstrap.
const (
	probeAttemptTimeout = time.Second
	probeAttempts       = 3
)

type probeResult uint8

const (
	probeAbsent    probeResult = iota // refused, or no socket file
	probeRegistrar                    // a troupe node that serves a registry
	probeOccupied                     // anything else
	probeAuth                         // a troupe node whose secret differs
)

// runtimeDirName names the per-user directory troupe keeps sockets in,
// under $XDG_RUNTIME_DIR (or, with a "-UID" suffix, under the temp
// directory). Every program using troupe must agree on it to find the
// default registry socket, so it is a fixed name, not the package's import
// path: a vendored copy keeps it as it is.
const runtimeDirName = "troupe"

// RuntimeDir returns the per-user directory troupe keeps sockets in:
// $XDG_RUNTIME_DIR/troupe, else troupe-UID under the temp directory. Every
// program using troupe agrees on that name to find the default registry
// socket, so it is fixed, not the package's import path: a vendored copy
// keeps it as it is. RuntimeDir creates the directory with mode 0700 and
// refuses one that is a symlink or belongs to another user.
func RuntimeDir() (string, error) {
	base := os.Getenv("XDG_RUNTIME_DIR")
	dir := filepath.Join(base, runtimeDirName)
	if base == "" {
		dir = filepath.Join(os.TempDir(), runtimeDirName+"-"+strconv.Itoa(os.Getuid()))
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", err
	}
	if fi.Mode()&fs.ModeSymlink != 0 || !fi.IsDir() {
		return "", fmt.Errorf("troupe: runtime directory %s is not a plain directory", dir)
	}
	if uid, ok := fileOwner(fi); ok && uid != os.Getuid() {
		return "", fmt.Errorf("troupe: runtime directory %s belongs to uid %d, not %d", dir, uid, os.Getuid())
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("troupe: runtime directory %s is open to other users (mode %v)", dir, fi.Mode().Perm())
	}
	return dir, nil
}

// registryAddrs returns the registry addresses the config asks for.
func (c Config) registryAddrs() ([]Addr, error) {
	var out []Addr
	for _, s := range c.RegistryAddrs {
		a, err := ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("RegistryAddrs: %w", err)
		}
		out = append(out, a)
	}
	if len(out) > 0 {
		return out, nil
	}
	unixOnly := len(c.Listen) > 0
	for _, s := range c.Listen {
		if !strings.HasPrefix(s, "unix:") && !strings.HasPrefix(s, "/unix") {
			unixOnly = false
		}
	}
	if unixOnly {
		dir, err := RuntimeDir()
		if err != nil {
			return nil, err
		}
		a, err := parseUnixPath(filepath.Join(dir, defaultRegistrySocket))
		if err == nil {
			err = checkSocketPath(a.address)
		}
		if err != nil {
			return nil, fmt.Errorf("the default registry socket in the runtime directory: %w", err)
		}
		return []Addr{a}, nil
	}
	return []Addr{tcpAddr(DefaultRegistryTCP)}, nil
}

// probe finds out what holds addr: nothing, a registrar, or something
// else. A transient slow handshake is retried with a fresh connection.
func (n *Node) probe(ctx context.Context, addr Addr) (probeResult, string) {
	var why string
	for range probeAttempts {
		d := net.Dialer{Timeout: probeAttemptTimeout}
		c, err := d.DialContext(ctx, addr.network, addr.address)
		if err != nil {
			if isRefused(err) {
				return probeAbsent, ""
			}
			if ctx.Err() != nil {
				return probeOccupied, ctx.Err().Error()
			}
			why = err.Error()
			continue
		}
		if n.cfg.TLS != nil && !addr.isUnix() {
			tc := n.gate.clientTLS(c, addr)
			tctx, cancel := context.WithTimeout(ctx, probeAttemptTimeout)
			err := tc.HandshakeContext(tctx)
			cancel()
			if err != nil {
				c.Close()
				switch {
				case ctx.Err() != nil:
					return probeOccupied, ctx.Err().Error()
				case tlsRefusal(err):
					// A TLS server that does not accept this node's
					// certificate, or whose this node does not accept.
					return probeAuth, "the TLS handshake failed: " + err.Error()
				case isTimeout(err):
					why = "a slow TLS handshake: " + err.Error()
					continue
				}
				return probeOccupied, "no TLS server: " + err.Error()
			}
			c = tc
		}
		res, reason, retry := n.probeConn(c)
		c.Close()
		if !retry {
			return res, reason
		}
		why = reason
	}
	return probeOccupied, why
}

func (n *Node) probeConn(c net.Conn) (res probeResult, why string, retry bool) {
	c.SetDeadline(time.Now().Add(probeAttemptTimeout))
	h := n.gate.hello()
	h.flags |= helloProbe
	body, _, err := n.gate.dialHandshake(c, newFrameReader(c, maxHelloSize), h)
	if errors.Is(err, ErrAuth) {
		return probeAuth, strings.TrimPrefix(err.Error(), ErrAuth.Error()+": "), false
	}
	if err != nil && tlsRefusal(err) {
		// (TLS 1.3: the server checks the client's certificate after the
		// client's side of the handshake is done, and says so on the
		// first read.)
		return probeAuth, "the TLS handshake failed: " + err.Error(), false
	}
	if err != nil {
		return probeOccupied, "no troupe handshake: " + err.Error(), true
	}
	switch frameKind(body[0]) {
	case frameWelcome:
		w, err := parseHello(body[1:])
		if err != nil {
			return probeOccupied, err.Error(), false
		}
		if w.flags&helloRegistrar != 0 {
			return probeRegistrar, "", false
		}
		return probeOccupied, fmt.Sprintf("troupe node %q does not serve a registry", w.name), false
	case frameReject:
		r, _ := parseReject(body[1:])
		if r.code == rejectAuth {
			return probeAuth, "it refused this node: " + strings.TrimPrefix(r.text, ErrAuth.Error()+": "), false
		}
		return probeOccupied, "a troupe node refused the probe: " + r.text, false
	}
	return probeOccupied, "not a troupe handshake", false
}

// authHint says what to change about a failed authentication with a
// registrar, from the reason given.
func authHint(why string) string {
	switch {
	case strings.Contains(why, "unix peer uid"):
		return "the registrar's Config.AllowUIDs must list this process's user"
	case strings.Contains(why, "TLS"):
		return "the registrar's and this node's Config.TLS must accept each other's certificates"
	}
	return "the registrar and this node must have the same Config.Secret"
}

// probeAll probes every address concurrently.
func (n *Node) probeAll(ctx context.Context, addrs []Addr) ([]probeResult, []string) {
	res, why := make([]probeResult, len(addrs)), make([]string, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Go(func() { res[i], why[i] = n.probe(ctx, a) })
	}
	wg.Wait()
	return res, why
}

// bootstrap applies the registry rule: join a registrar that answers,
// fail on an address held by anything else, and become the registrar when
// every address is free — re-probing if another node wins the race to bind.
func (n *Node) bootstrap(ctx context.Context) error {
	regAddrs, err := n.cfg.registryAddrs()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadConfig, err)
	}
	for round := 0; ; round++ {
		res, why := n.probeAll(ctx, regAddrs)
		var occupied, answering, auth []string
		var registrars []Addr
		for i, r := range res {
			switch r {
			case probeOccupied:
				occupied = append(occupied, regAddrs[i].String()+" ("+why[i]+")")
			case probeAuth:
				auth = append(auth, "the registrar at "+regAddrs[i].String()+": "+why[i])
			case probeRegistrar:
				registrars = append(registrars, regAddrs[i])
				answering = append(answering, regAddrs[i].String())
			}
		}
		if len(auth) > 0 {
			why := strings.Join(auth, ", ")
			return fmt.Errorf("%w: %s; %s", ErrAuth, why, authHint(why))
		}
		if len(occupied) > 0 {
			return fmt.Errorf("%w: %s", ErrRegistryOccupied, strings.Join(occupied, ", "))
		}
		if len(registrars) > 0 {
			if n.cfg.EnsureRegistry {
				return fmt.Errorf("%w: %s", ErrRegistryRunning, strings.Join(answering, ", "))
			}
			n.disc.registrars = registrars
			if err := n.lis.listenAll(ctx, n.cfg.Listen); err != nil {
				return err
			}
			if len(n.lis.all()) == 0 {
				// A joining node binds random addresses in the registry's
				// transport.
				own := "tcp://127.0.0.1:0"
				if registrars[0].isUnix() {
					dir, err := RuntimeDir()
					if err != nil {
						return err
					}
					own = "unix://" + filepath.Join(dir, "node-"+n.uid.String()[:12]+".sock")
				}
				if err := n.lis.listenAll(ctx, []string{own}); err != nil {
					return err
				}
			}
			return nil
		}
		// Every address is free: become the registrar.
		err := n.listenRegistry(ctx, regAddrs)
		if err == nil {
			return n.registrar.startRegistrar()
		}
		if !isAddrInUse(err) || round >= 5 {
			return err
		}
		// Another node bound first: probe again and join it.
	}
}

// listenRegistry binds the registry addresses and then cfg.Listen; on any
// failure it releases what it bound.
func (n *Node) listenRegistry(ctx context.Context, regAddrs []Addr) error {
	var list []string
	for _, a := range regAddrs {
		list = append(list, a.String())
	}
	for _, s := range n.cfg.Listen {
		if a, err := ParseAddr(s); err == nil && !containsAddr(regAddrs, a) {
			list = append(list, s)
		}
	}
	if err := n.lis.listenAll(ctx, list); err != nil {
		n.lis.closeAll(false)
		return err
	}
	return nil
}

func containsAddr(list []Addr, a Addr) bool {
	for _, x := range list {
		if x == a {
			return true
		}
	}
	return false
}
