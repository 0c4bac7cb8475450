package troupe

import (
	"crypto/hmac"
	"crypto/rand"
	"fmt"
	"net"
)

// Session tokens: a new connection that claims a session this node holds
// with a peer (a second connection of the same incarnation, a resume, a
// redial that replaces a suspended session) must prove that it comes from
// that peer, not from anyone who read its uid in a listing or a ref.
//
// A session's tokens are drawn when it begins: each side draws a random
// token for the peer when a connection founds a session with it (there
// was none, or the one there was is replaced) and sends it as the first
// frame (after a resume frame) of that connection. Each side keeps the
// token it received with the session, and it moves with the session to a
// connection that resumes it or wins as a duplicate. A token is sent
// again only on a connection whose peer proved the session's token
// itself, so a connection that joins a session unproven (its peer's token
// had not arrived) learns nothing. A new session gets new tokens: what a
// stranger learned by claiming a peer's uid before the peer connected
// proves nothing about the peer's later sessions.
//
// The node remembers the last token it drew for each peer (tokenTable,
// bounded) beyond the session's end, to prove a claim on a session the
// peer may still hold: a redial after this side gave the session up.
//
// A claim is proven with the claimant's own token, over a fresh nonce of
// the side that checks, so a token crosses the wire only in token frames,
// never in a proof, and a recorded proof does not prove anything again:
//
//   - a dialer whose hello claims a uid the acceptor holds a session with
//     is challenged (a tokenchallenge frame: the acceptor's uid and a
//     fresh nonce) and answers with a proof frame:
//     HMAC(token, "troupe-v1-claim-dialer" || acceptor nonce || dialer
//     nonce || dialer uid || acceptor uid);
//   - an acceptor proves its own claim in every welcome to a dialer that
//     speaks tokens: HMAC(token, "troupe-v1-claim-acceptor" || dialer
//     nonce || acceptor uid || dialer uid), the dialer nonce from its
//     hello; or, when it holds no session with the dialer (this
//     connection founds one), HMAC(token, "troupe-v1-claim-acceptor-none"
//     || dialer nonce || acceptor uid || dialer uid) with the last token
//     it drew for the dialer (32 zero bytes if it has none, which proves
//     nothing).
//
// A connection that would take over a session whose token this node holds
// (the fresh one wins a duplicate, resumes a suspended session or replaces
// it) without the proof is refused, and the session is untouched. A
// session with a peer that speaks no tokens (a node of an earlier
// release), or whose token frame has not arrived yet, asks no proof.

// maxKeptTokens bounds the tokens a node remembers after their sessions
// ended (tokenTable): past it the oldest of those is forgotten, and a
// claim that needed it is refused as unproven. The tokens of the sessions
// the node holds are kept beyond it.
const maxKeptTokens = 4096

// tokenTable is the last session token this node drew for each peer
// incarnation. Its own lock; written when a session is founded.
type tokenTable struct {
	mu    mutex[lkTokens]
	byUID map[NodeUID][]byte
	order []NodeUID // oldest first, for the bound
}

// issue draws a new token for peer, for a session that begins. Past the
// bound it forgets the oldest token of a peer that holds no session
// (live reports which do): a live session's token is what this node
// proves it with (a resume, a second connection), and forgetting it
// would end the session at its next connection.
func (t *tokenTable) issue(peer NodeUID, live func(NodeUID) bool) []byte {
	tok := make([]byte, tokenSize)
	rand.Read(tok)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byUID == nil {
		t.byUID = map[NodeUID][]byte{}
	}
	if _, ok := t.byUID[peer]; !ok {
		t.order = append(t.order, peer)
		for kept := 0; len(t.order) > maxKeptTokens && kept < len(t.order); {
			old := t.order[0]
			t.order = t.order[1:]
			if old == peer || live(old) {
				t.order = append(t.order, old) // (kept: to the back)
				kept++
				continue
			}
			delete(t.byUID, old)
		}
	}
	t.byUID[peer] = tok
	return tok
}

// get is the last token drawn for peer, or nil.
func (t *tokenTable) get(peer NodeUID) []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byUID[peer]
}

// noSessionProof is an acceptor's welcome proof when it holds no session
// with the dialer, and a claimant's answer when it has no token: it
// proves nothing.
var noSessionProof = make([]byte, tokenSize)

// tokenFor is this node's token for its session with peer (the last one
// it drew), or nil.
func (g *gate) tokenFor(peer NodeUID) []byte { return g.tokens.get(peer) }

// provesSession reports whether p, what the handshake of a connection
// (outbound or not) that claimed uid learned, proves that the peer holds
// token, the session token uid gave this node.
func (g *gate) provesSession(outbound bool, p *peerInfo, uid NodeUID, token []byte) bool {
	if p.proof == nil {
		return false
	}
	if outbound {
		return hmac.Equal(p.proof, authMAC(token, "claim-acceptor", p.nonce, nil, uid, g.n.uid))
	}
	return p.challenged != nil && hmac.Equal(p.proof, authMAC(token, "claim-dialer", p.challenged, p.nonce, uid, g.n.uid))
}

// provesNoSession reports whether p, what the handshake of an outbound
// connection whose welcome claimed uid learned, says that the peer holds
// no session with this node: a proof of the session's token (the token
// uid gave this node) with the no-session label. The 32 zero bytes prove
// nothing: anyone can send them.
func (g *gate) provesNoSession(outbound bool, p *peerInfo, uid NodeUID, token []byte) bool {
	return outbound && p.proof != nil && hmac.Equal(p.proof, authMAC(token, "claim-acceptor-none", p.nonce, nil, uid, g.n.uid))
}

// sessionProof is the proof an acceptor puts in its welcome to a dialer
// whose hello carried nonce: of the token of the session it holds with
// it; or, when the connection founds a session, that it holds none, with
// the token it last drew for the dialer (prev, drawn for a session the
// dialer may still hold), or noSessionProof if it has none.
func (g *gate) sessionProof(dialer NodeUID, nonce []byte, founds bool, prev []byte) []byte {
	if founds {
		if prev == nil {
			return noSessionProof
		}
		return authMAC(prev, "claim-acceptor-none", nonce, nil, g.n.uid, dialer)
	}
	tok := g.tokenFor(dialer)
	if tok == nil {
		return noSessionProof
	}
	return authMAC(tok, "claim-acceptor", nonce, nil, g.n.uid, dialer)
}

// holdsSession reports whether this node holds a session with uid: a
// connection claiming it is to be challenged.
func (g *gate) holdsSession(uid NodeUID) bool {
	return g.n.peers.withUID(uid) != nil
}

// mayTakeOver reports whether an inbound connection whose hello claimed
// uid, and whose handshake learned p, may take over the session this node
// holds with uid, if it holds one: it proved that it holds the session's
// token, or the session has none.
func (g *gate) mayTakeOver(p *peerInfo, uid NodeUID) bool {
	ex := g.n.peers.withUID(uid)
	if ex == nil {
		return true
	}
	ex.mu.Lock()
	token := ex.peerToken
	ex.mu.Unlock()
	return token == nil || g.provesSession(false, p, uid, token)
}

// challengeToken runs the acceptor's token challenge for hello h: it
// returns the nonce it sent and the dialer's proof (checked later, against
// the session the connection would take over).
func (g *gate) challengeToken(c net.Conn, fr *frameReader, h *hello) (nonce, proof []byte, err error) {
	nonce = newNonce()
	if _, err := c.Write(appendFrame(nil, func(b []byte) []byte {
		return appendTokenChallenge(b, tokenChallenge{uid: g.n.uid, nonce: nonce})
	})); err != nil {
		return nil, nil, err
	}
	body, err := fr.next()
	if err != nil {
		return nil, nil, fmt.Errorf("no proof of the session token: %w", err)
	}
	if frameKind(body[0]) == frameProof {
		proof, err = parseProof(body[1:])
	}
	if proof == nil || err != nil {
		return nil, nil, fmt.Errorf("%w: expected a proof of the session token", ErrMalformed)
	}
	return nonce, append([]byte(nil), proof...), nil
}

// answerTokenChallenge is the dialer's answer to a token challenge: the
// proof frame, made with this node's token for the challenger.
func (g *gate) answerTokenChallenge(body []byte, h *hello) ([]byte, error) {
	if h.session == nil {
		return nil, fmt.Errorf("%w: a token challenge to a hello without a session nonce", ErrMalformed)
	}
	tc, err := parseTokenChallenge(body)
	if err != nil {
		return nil, err
	}
	proof := noSessionProof // (no token for the challenger: the claim fails)
	if tok := g.tokenFor(tc.uid); tok != nil {
		proof = authMAC(tok, "claim-dialer", tc.nonce, h.session, g.n.uid, tc.uid)
	}
	return appendFrame(nil, func(b []byte) []byte { return appendProof(b, proof) }), nil
}

// The session tokens' frames.

// tokenChallenge is the acceptor's demand that a dialer whose hello
// claims a session it holds prove it holds that session's token: its uid
// and a fresh nonce. The dialer answers with a proof frame.
type tokenChallenge struct {
	uid   NodeUID
	nonce []byte
}

func appendTokenChallenge(b []byte, c tokenChallenge) []byte {
	b = append(b, byte(frameTokenChallenge))
	b = append(b, c.uid[:]...)
	return append(b, c.nonce...)
}

// parseTokenChallenge parses a token challenge; its nonce points into b.
func parseTokenChallenge(b []byte) (tokenChallenge, error) {
	d := decoder{b: b}
	var c tokenChallenge
	copy(c.uid[:], d.take(idSize))
	c.nonce = d.take(nonceSize)
	return c, d.whole("tokenchallenge")
}

// appendToken appends the sender's session token for the receiver.
func appendToken(b []byte, token []byte) []byte {
	return append(append(b, byte(frameToken)), token...)
}

// parseToken returns the token, which points into b.
func parseToken(b []byte) ([]byte, error) {
	d := decoder{b: b}
	t := d.take(tokenSize)
	return t, d.whole("token")
}

// sessionTokens settles a's tokens once attach admitted it (peers.mu held,
// before its writer starts): a connection that founds a session draws
// this node's token for it; one that wins over the held connection
// carries the session's token from the peer; and the token frame goes on
// a connection that founds the session or whose peer proved it.
func (g *gate) sessionTokens(a *assoc, d admission) {
	if !a.peer.tokens {
		return
	}
	if d.founds {
		g.tokens.issue(a.peer.uid, func(uid NodeUID) bool { return g.n.peers.byUID[uid] != nil })
	}
	a.open.sendToken = d.founds || d.proven
	if d.winner == a && d.loser != nil {
		ex := d.loser
		ex.mu.Lock()
		token := ex.peerToken
		ex.mu.Unlock()
		a.mu.Lock()
		if a.peerToken == nil {
			a.peerToken = token
		}
		a.mu.Unlock()
	}
}
