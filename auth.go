package troupe

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"unicode/utf8"
)

// ErrAuth is wrapped by the error of a connection that failed
// authentication: a missing or wrong shared secret, on either side.
var ErrAuth = errors.New("troupe: authentication failed")

// ReadSecretFile reads a shared secret for [Config.Secret] from a file, as
// the troupe command's --secret-file does, so that a service and the
// command read one file alike: its bytes as they are, but that one
// trailing newline ("\n" or "\r\n") is dropped when the rest is one line
// of text (valid UTF-8 without another line break or a NUL), as echo and
// editors write it. A binary secret is taken whole. It fails for a
// secret under 16 bytes, wrapping [ErrBadConfig].
func ReadSecretFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if line, ok := bytes.CutSuffix(b, []byte("\n")); ok {
		line = bytes.TrimSuffix(line, []byte("\r"))
		if utf8.Valid(line) && !bytes.ContainsAny(line, "\n\r\x00") {
			b = line
		}
	}
	if len(b) < 16 {
		return nil, fmt.Errorf("%w: the secret in %s is %d bytes, at least 16 are needed", ErrBadConfig, path, len(b))
	}
	return b, nil
}

func newNonce() []byte {
	b := make([]byte, nonceSize)
	rand.Read(b)
	return b
}

// authMAC proves knowledge of the secret for one role of one handshake:
// it covers both nonces and both uids, and the role label keeps a proof
// from being reflected back as the other side's.
func authMAC(secret []byte, role string, mine, theirs []byte, me, them NodeUID) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("troupe-v1-" + role))
	m.Write(mine)
	m.Write(theirs)
	m.Write(me[:])
	m.Write(them[:])
	return m.Sum(nil)
}

// downedMAC is a dialer's proof, with the secret, that its cluster
// downed the incarnation downed (hello extension 6). It covers both uids
// and no nonce: the notice needs no answer, and a replay can only tell
// that same incarnation again what the dialer's cluster decided.
func downedMAC(secret []byte, by, downed NodeUID) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("troupe-v1-downed"))
	m.Write(by[:])
	m.Write(downed[:])
	return m.Sum(nil)
}

// dialHandshake sends h on c and returns the acceptor's verdict frame
// (welcome or reject), answering an authentication challenge and a token
// challenge on the way, and how many round trips it took. With a secret,
// an acceptor that does not prove it knows the secret is refused.
func (g *gate) dialHandshake(c net.Conn, fr *frameReader, h *hello) (verdict []byte, trips int, err error) {
	secret := g.n.cfg.Secret
	var nonce []byte
	if secret != nil {
		nonce = newNonce()
		h.auth = nonce
	}
	if _, err := c.Write(appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameHello, h) })); err != nil {
		return nil, trips, err
	}
	trips = 1
	body, err := fr.next()
	if err != nil {
		return nil, trips, err
	}
	switch kind := frameKind(body[0]); {
	case kind == frameChallenge:
		if secret == nil {
			return nil, trips, fmt.Errorf("%w: the peer requires a shared secret and this node has none (Config.Secret)", ErrAuth)
		}
		ch, err := parseChallenge(body[1:])
		if err != nil {
			return nil, trips, fmt.Errorf("%w: bad challenge frame", ErrMalformed)
		}
		theirNonce := append([]byte(nil), ch.nonce...) // the frame buffer is reused
		if !hmac.Equal(ch.mac, authMAC(secret, "acceptor", nonce, theirNonce, ch.uid, g.n.uid)) {
			return nil, trips, fmt.Errorf("%w: the peer does not know the shared secret", ErrAuth)
		}
		proof := authMAC(secret, "dialer", theirNonce, nonce, g.n.uid, ch.uid)
		if _, err := c.Write(appendFrame(nil, func(b []byte) []byte { return appendProof(b, proof) })); err != nil {
			return nil, trips, err
		}
		trips++
		if body, err = fr.next(); err != nil {
			return nil, trips, err
		}
	case secret != nil && (kind == frameWelcome || kind == frameTokenChallenge):
		return nil, trips, fmt.Errorf("%w: the peer did not authenticate (it has no shared secret configured)", ErrAuth)
	}
	if frameKind(body[0]) == frameTokenChallenge {
		// This connection claims a session the acceptor holds: prove it.
		proof, err := g.answerTokenChallenge(body[1:], h)
		if err != nil {
			return nil, trips, err
		}
		if _, err := c.Write(proof); err != nil {
			return nil, trips, err
		}
		body, err = fr.next()
		return body, trips + 1, err
	}
	return body, trips, nil
}

// acceptAuth runs the acceptor's half of the secret handshake for hello h:
// it challenges the dialer and checks its proof. nil means the dialer
// proved it knows the secret (or no secret is configured).
func (g *gate) acceptAuth(c net.Conn, fr *frameReader, h *hello) error {
	secret := g.n.cfg.Secret
	if secret == nil {
		return nil
	}
	if len(h.auth) != nonceSize {
		return fmt.Errorf("%w: a shared secret is required (Config.Secret) and the dialer offered none", ErrAuth)
	}
	nonce := newNonce()
	mac := authMAC(secret, "acceptor", h.auth, nonce, g.n.uid, h.uid)
	if _, err := c.Write(appendFrame(nil, func(b []byte) []byte { return appendChallenge(b, challengeBody{uid: g.n.uid, nonce: nonce, mac: mac}) })); err != nil {
		return err
	}
	body, err := fr.next()
	if err != nil {
		return fmt.Errorf("%w: no proof of the shared secret (the peer does not know it?): %v", ErrAuth, err)
	}
	var proof []byte
	if frameKind(body[0]) == frameProof {
		proof, err = parseProof(body[1:])
	}
	if proof == nil || err != nil {
		return fmt.Errorf("%w: expected a proof of the shared secret", ErrAuth)
	}
	if !hmac.Equal(proof, authMAC(secret, "dialer", nonce, h.auth, h.uid, g.n.uid)) {
		return fmt.Errorf("%w: wrong shared secret", ErrAuth)
	}
	return nil
}

// tlsRefusal reports whether err is one end of a TLS handshake refusing
// the other's certificate: an alert from the peer, or this end's failed
// verification. A stream that is not TLS at all is not one.
func tlsRefusal(err error) bool {
	if _, ok := errors.AsType[*tls.CertificateVerificationError](err); ok {
		return true
	}
	op, ok := errors.AsType[*net.OpError](err)
	return ok && op.Op == "remote error"
}

// isTimeout reports whether err is a deadline passing.
func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	ne, ok := errors.AsType[net.Error](err)
	return ok && ne.Timeout()
}

// clientTLS wraps an outbound TCP connection in TLS, verifying the server
// against the name it was dialed by unless the config names one.
func (g *gate) clientTLS(c net.Conn, addr Addr) *tls.Conn {
	cfg := g.n.cfg.TLS.Clone()
	if cfg.ServerName == "" {
		host, _, _ := net.SplitHostPort(addr.address)
		cfg.ServerName = host
	}
	return tls.Client(c, cfg)
}

// The secret handshake's frames.

// challengeBody is the acceptor's half of the secret handshake: its uid,
// its nonce and its proof that it knows the secret.
type challengeBody struct {
	uid   NodeUID
	nonce []byte
	mac   []byte
}

func appendChallenge(b []byte, c challengeBody) []byte {
	b = append(b, byte(frameChallenge))
	b = append(b, c.uid[:]...)
	b = append(b, c.nonce...)
	return append(b, c.mac...)
}

// parseChallenge parses a challenge; the slices it returns point into b.
func parseChallenge(b []byte) (challengeBody, error) {
	d := decoder{b: b}
	var c challengeBody
	copy(c.uid[:], d.take(idSize))
	c.nonce = d.take(nonceSize)
	c.mac = d.take(macSize)
	return c, d.whole("challenge")
}

// appendProof appends the dialer's half: its proof that it knows the secret.
func appendProof(b []byte, mac []byte) []byte {
	return append(append(b, byte(frameProof)), mac...)
}

// parseProof returns the proof, which points into b.
func parseProof(b []byte) ([]byte, error) {
	d := decoder{b: b}
	mac := d.take(macSize)
	return mac, d.whole("proof")
}

// allowPeerUID decides whether a Unix socket peer running as uid may
// connect: this process's own user or one of [Config.AllowUIDs]. pid is
// for the log and the rejection only; 0 where the platform does not say.
func (g *gate) allowPeerUID(uid, pid int) error {
	if uid == os.Getuid() || slices.Contains(g.n.cfg.AllowUIDs, uid) {
		return nil
	}
	g.n.log.Warn("troupe: refused a unix socket peer of another user", "uid", uid, "pid", pid)
	return fmt.Errorf("%w: unix peer uid %d (pid %d) is not allowed; this node accepts uid %d and Config.AllowUIDs", ErrRejected, uid, pid, os.Getuid())
}
