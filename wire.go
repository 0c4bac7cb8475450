package troupe

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// The byte layout is specified in wire.md; change both together.

// ProtocolVersion is the wire protocol version a node speaks (see wire.md).
// A peer with another version is refused in the handshake.
const ProtocolVersion = 2

// protocolVersion is [ProtocolVersion] as the hello frame carries it.
const protocolVersion uint8 = ProtocolVersion

// magic opens every hello and welcome, so a stray client of some other
// protocol is told apart from a troupe node at once.
const magic = "TRP"

// frameKind is the first byte of every frame body.
type frameKind uint8

// Append only: values are on the wire.
const (
	frameInvalid        frameKind = iota // never sent
	frameHello                           // dialer → acceptor: who I am
	frameWelcome                         // acceptor → dialer: accepted, who I am
	frameReject                          // acceptor → dialer: refused, and why
	frameTell                            // a user message for an actor
	frameWatch                           // start watching an actor
	frameUnwatch                         // stop watching an actor
	frameTerminated                      // a watched actor stopped
	frameResolve                         // look up an actor by path
	frameResolved                        // the answer to frameResolve
	frameBye                             // the sender is leaving gracefully
	frameHeartbeat                       // a sign of life
	frameChallenge                       // acceptor → dialer: prove you know the secret
	frameProof                           // dialer → acceptor: the proof
	frameAck                             // how many tell (or sequenced) frames have been received
	frameResume                          // a resumed session: how many sequenced frames were received
	frameCredit                          // receiver → sender: more messages an actor's mailbox takes
	frameDraining                        // the sender is shutting down: it takes no new asks
	frameShape                           // a wire key's shape, before the first message of it (see shape.go)
	frameTellHeaders                     // a user message for an actor, with headers (see headers.go)
	frameTokenChallenge                  // acceptor → dialer: prove you hold the session token of the uid you claim
	frameToken                           // the sender's session token for the receiver (see token.go)
	frameKindCount                       // one past the last kind
)

var frameNames = [...]string{"invalid", "hello", "welcome", "reject", "tell", "watch", "unwatch", "terminated", "resolve", "resolved", "bye", "heartbeat", "challenge", "proof", "ack", "resume", "credit", "draining", "shape", "tellheaders", "tokenchallenge", "token"}

// sequenced reports whether frames of kind k are counted, acknowledged and,
// after a link flap, sent again: every frame written from the send queue.
// Handshake frames, heartbeats, acknowledgements and resumes belong to one
// connection and are not.
func (k frameKind) sequenced() bool {
	switch k {
	case frameTell, frameWatch, frameUnwatch, frameTerminated, frameResolve, frameResolved, frameBye, frameCredit, frameDraining, frameShape, frameTellHeaders:
		return true
	}
	return false
}

// isTell reports whether frames of kind k carry a user message: they are
// counted, acknowledged and given up on as tells.
func (k frameKind) isTell() bool { return k == frameTell || k == frameTellHeaders }

func (k frameKind) String() string {
	if int(k) < len(frameNames) {
		return frameNames[k]
	}
	return fmt.Sprintf("frame(%d)", uint8(k))
}

// Limits of the framing layer.
const (
	// defaultMaxFrameSize is the default of [Config.MaxFrameSize].
	defaultMaxFrameSize = 4 << 20
	// maxTableSize bounds the per-association tables of target and type
	// ids a peer may define: 4096 entries of at most maxTableEntry bytes,
	// so each table holds at most 1 MiB of a peer's strings. A sender with
	// more targets sends the rest inline (id 0), as it does a long path.
	maxTableSize = 1 << 12
	// maxTableEntry bounds one table entry's path or wire key (wire keys
	// are at most 255 bytes anyway).
	maxTableEntry = 256
	// readBufferSize is the size of a connection's read buffer; a frame
	// that fits is decoded in place without a copy.
	readBufferSize = 64 << 10
)

// frameError is the error that closes an association because a peer sent a
// frame this node cannot accept. It wraps [ErrMalformed] or [ErrFrameTooBig].
type frameError struct {
	Peer   string // the remote network address
	Kind   string // the frame kind, when it was read
	Reason error
}

func (e *frameError) Error() string {
	if e.Kind != "" {
		return fmt.Sprintf("troupe: bad %s frame from %s: %v", e.Kind, e.Peer, e.Reason)
	}
	return fmt.Sprintf("troupe: bad frame from %s: %v", e.Peer, e.Reason)
}

func (e *frameError) Unwrap() error { return e.Reason }

// appendFrame appends a frame whose body is produced by body: it reserves
// one byte for the length, and moves the body if the length needs more.
func appendFrame(dst []byte, body func(b []byte) []byte) []byte {
	start := len(dst)
	dst = append(dst, 0)
	dst = body(dst)
	return fixLength(dst, start)
}

// fixLength writes the uvarint length of dst[start+1:] at dst[start],
// shifting the body when the length takes more than one byte.
func fixLength(dst []byte, start int) []byte {
	n := len(dst) - start - 1
	if n < 0x80 {
		dst[start] = byte(n)
		return dst
	}
	var tmp [binary.MaxVarintLen64]byte
	k := binary.PutUvarint(tmp[:], uint64(n))
	dst = append(dst, tmp[:k-1]...)
	copy(dst[start+k:], dst[start+1:start+1+n])
	copy(dst[start:], tmp[:k])
	return dst
}

// hello is the body of a frameHello or frameWelcome: who a node is.
type hello struct {
	version uint8
	flags   uint8 // helloRegistrar, helloProbe, helloDedicated
	uid     NodeUID
	name    string
	addrs   []string // listen addresses, URL form
	auth    []byte   // the dialer's nonce, or the acceptor's proof (see auth.go)
	// Extensions (version 2): tagged fields after auth, unknown tags
	// skipped, so a field can be added without a new protocol version.
	appVersion string // Config.AppVersion
	observer   bool   // Config.Observer
	headers    bool   // the sender takes tells with headers
	// session (tag 4; see token.go): in a hello, the dialer's fresh
	// nonce; in a welcome, the acceptor's proof of its session token.
	// Either says that the sender speaks session tokens.
	session []byte
	// dial (tag 5; a hello's): the dial's number, increasing with each
	// connection the sender dials; 0 when absent. ordered: the sender
	// sent tag 5 (a welcome's is empty): it orders a dialer's connections
	// by their numbers (see chooseDuplicate).
	dial    uint64
	ordered bool
	// downed (tag 6; a hello's): the dialer's cluster downed the
	// acceptor's incarnation downed.uid (see heardDowned); nil when
	// absent.
	downed *downedNotice
}

// downedNotice is the value of hello extension 6: the uid of the
// incarnation the dialer's cluster downed, and, with Config.Secret, the
// dialer's proof over both uids (downedMAC).
type downedNotice struct {
	uid NodeUID
	mac []byte
}

// Hello extension tags. Append only: values are on the wire.
const (
	helloExtAppVersion uint64 = 1 // string: Config.AppVersion
	helloExtObserver   uint64 = 2 // empty: the sender is an Observer
	helloExtHeaders    uint64 = 3 // empty: the sender takes frameTellHeaders
	helloExtSession    uint64 = 4 // 32 bytes: a hello's nonce, a welcome's token proof (see token.go)
	helloExtDial       uint64 = 5 // a hello's: uvarint, the dial's number; a welcome's: empty (see chooseDuplicate)
	helloExtDowned     uint64 = 6 // a hello's: the downed uid, then with a secret its 32-byte proof (see heardDowned)
)

// Bounds on a hello's extensions.
const (
	maxHelloExts = 16
	// maxAppVersion bounds [Config.AppVersion], in bytes.
	maxAppVersion = 128
)

func appendHello(b []byte, kind frameKind, h *hello) []byte {
	b = append(b, byte(kind))
	b = append(b, magic...)
	b = append(b, h.version, h.flags)
	b = append(b, h.uid[:]...)
	b = appendString(b, h.name)
	b = binary.AppendUvarint(b, uint64(len(h.addrs)))
	for _, a := range h.addrs {
		b = appendString(b, a)
	}
	b = binary.AppendUvarint(b, uint64(len(h.auth)))
	b = append(b, h.auth...)
	exts := byte(0)
	if h.appVersion != "" {
		exts++
	}
	if h.observer {
		exts++
	}
	if h.headers {
		exts++
	}
	if h.session != nil {
		exts++
	}
	if h.dial != 0 || h.ordered {
		exts++
	}
	if h.downed != nil {
		exts++
	}
	b = append(b, exts)
	if h.appVersion != "" {
		b = binary.AppendUvarint(b, helloExtAppVersion)
		b = appendString(b, h.appVersion)
	}
	if h.observer {
		b = binary.AppendUvarint(b, helloExtObserver)
		b = append(b, 0) // an empty value
	}
	if h.headers {
		b = binary.AppendUvarint(b, helloExtHeaders)
		b = append(b, 0)
	}
	if h.session != nil {
		b = binary.AppendUvarint(b, helloExtSession)
		b = binary.AppendUvarint(b, uint64(len(h.session)))
		b = append(b, h.session...)
	}
	if h.dial != 0 {
		var num [binary.MaxVarintLen64]byte
		k := binary.PutUvarint(num[:], h.dial)
		b = binary.AppendUvarint(b, helloExtDial)
		b = binary.AppendUvarint(b, uint64(k))
		b = append(b, num[:k]...)
	} else if h.ordered {
		b = binary.AppendUvarint(b, helloExtDial)
		b = append(b, 0)
	}
	if h.downed != nil {
		b = binary.AppendUvarint(b, helloExtDowned)
		b = binary.AppendUvarint(b, uint64(idSize+len(h.downed.mac)))
		b = append(b, h.downed.uid[:]...)
		b = append(b, h.downed.mac...)
	}
	return b
}

// Hello flags. Append only: values are on the wire.
const (
	helloRegistrar uint8 = 1 << iota // the sender serves a registry
	helloProbe                       // the dialer only probes: answer and forget it
	helloDedicated                   // the sender is a dedicated registrar (EnsureRegistry): nodes wait for it rather than take its address over
	helloResumable                   // the sender sequences every queued frame and can resume a session over a new connection
	helloResuming                    // hello: this connection resumes the session with you; welcome: resumed
	helloCredit                      // the sender grants and heeds per-actor credit (frameCredit)
	helloDrains                      // the sender understands frameDraining
	helloShapes                      // the sender sends and heeds shapes (frameShape)
)

// maxHelloAddrs bounds the listen addresses a peer may announce.
const maxHelloAddrs = 64

// parseHello parses the body of a hello or welcome after its kind byte.
func parseHello(b []byte) (*hello, error) {
	d := decoder{b: b}
	if string(d.take(len(magic))) != magic {
		return nil, fmt.Errorf("%w: not a troupe handshake", ErrMalformed)
	}
	h := &hello{version: d.byte()}
	if h.version != protocolVersion {
		return h, fmt.Errorf("%w: protocol version %d, want %d", ErrMalformed, h.version, protocolVersion)
	}
	h.flags = d.byte()
	copy(h.uid[:], d.take(idSize))
	h.name = d.string()
	n := d.uvarint()
	if n > maxHelloAddrs {
		return nil, fmt.Errorf("%w: %d addresses in handshake, at most %d", ErrMalformed, n, maxHelloAddrs)
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		h.addrs = append(h.addrs, d.string())
	}
	h.auth = append([]byte(nil), d.bytes()...) // the frame buffer is reused
	exts := d.uvarint()
	if d.err == nil && exts > maxHelloExts {
		return nil, fmt.Errorf("%w: %d handshake extensions, at most %d", ErrMalformed, exts, maxHelloExts)
	}
	for i := uint64(0); i < exts && d.err == nil; i++ {
		tag, v := d.uvarint(), d.bytes()
		switch tag {
		case helloExtAppVersion:
			if len(v) > maxAppVersion {
				return nil, fmt.Errorf("%w: an app version of %d bytes, at most %d", ErrMalformed, len(v), maxAppVersion)
			}
			h.appVersion = string(v)
		case helloExtObserver:
			h.observer = true
		case helloExtHeaders:
			h.headers = true
		case helloExtSession:
			if len(v) != nonceSize {
				return nil, fmt.Errorf("%w: a session extension of %d bytes, want %d", ErrMalformed, len(v), nonceSize)
			}
			h.session = append([]byte(nil), v...) // the frame buffer is reused
		case helloExtDial:
			h.ordered = true
			if len(v) > 0 {
				dv := decoder{b: v}
				h.dial = dv.uvarint()
				if err := dv.whole("dial number"); err != nil || h.dial == 0 {
					return nil, fmt.Errorf("%w: a bad dial number in a hello", ErrMalformed)
				}
			}
		case helloExtDowned:
			if len(v) != idSize && len(v) != idSize+macSize {
				return nil, fmt.Errorf("%w: a downed notice of %d bytes, want %d or %d", ErrMalformed, len(v), idSize, idSize+macSize)
			}
			h.downed = &downedNotice{mac: append([]byte(nil), v[idSize:]...)} // (the frame buffer is reused)
			copy(h.downed.uid[:], v)
		}
		// (an unknown tag is a later version's: skipped)
	}
	if d.err == nil && d.remaining() != 0 {
		d.fail("%d bytes after handshake", d.remaining())
	}
	return h, d.err
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Reject codes of a frameReject. Append only: values are on the wire.
const (
	rejectOther       byte = iota // see the text
	rejectDuplicate               // the other connection between these nodes wins
	rejectClosing                 // the acceptor is shutting down
	rejectVersion                 // unsupported protocol version
	rejectAuth                    // the peer is not allowed
	rejectQuarantined             // the acceptor has quarantined the dialer
)

// Termination reason codes in a frameTerminated. Append only.
const (
	reasonNone          byte = iota // stopped normally
	reasonActorStopped              // ErrActorStopped
	reasonNoSuchActor               // ErrNoSuchActor
	reasonParentStopped             // ErrParentStopped
	reasonNodeClosed                // ErrNodeClosed
	reasonOther                     // text follows
	reasonFailed                    // the actor failed (IsFailure); text follows
	reasonWatchRefused              // ErrWatchRefused: the watch was not placed; text follows
)

var reasonErrs = [...]error{reasonActorStopped: ErrActorStopped, reasonNoSuchActor: ErrNoSuchActor, reasonParentStopped: ErrParentStopped, reasonNodeClosed: ErrNodeClosed}

func reasonCode(err error) (byte, string) {
	if err == nil {
		return reasonNone, ""
	}
	if IsFailure(err) {
		// First: a failure may wrap one of troupe's errors (an Ask's
		// error passed to Fail), and it is still the actor's failure.
		return reasonFailed, err.Error()
	}
	if errors.Is(err, ErrWatchRefused) {
		return reasonWatchRefused, strings.TrimPrefix(err.Error(), ErrWatchRefused.Error()+": ")
	}
	for code, e := range reasonErrs {
		if e != nil && errors.Is(err, e) {
			return byte(code), ""
		}
	}
	return reasonOther, err.Error()
}

// remoteError carries the text of an error that happened on another node,
// such as the panic that stopped a remote actor. Failed says that it
// was the actor's failure (see [IsFailure]).
type remoteError struct {
	Text   string
	Failed bool
}

func (e *remoteError) Error() string { return e.Text }

func reasonErr(code byte, text string) error {
	if code == reasonNone {
		return nil
	}
	if int(code) < len(reasonErrs) && reasonErrs[code] != nil {
		return reasonErrs[code]
	}
	if code == reasonWatchRefused {
		return fmt.Errorf("%w: %s", ErrWatchRefused, text)
	}
	return &remoteError{Text: text, Failed: code == reasonFailed}
}

// Sizes of the fixed-size fields of frames.
const (
	// idSize is the size of a NodeUID or an actor UUID: 16 random bytes,
	// so that two incarnations never share one.
	idSize = 16
	// nonceSize is the size of an authentication nonce: 32 random bytes,
	// as many as the MAC's hash, so that no nonce repeats.
	nonceSize = 32
	// macSize is the size of an authentication proof (HMAC-SHA-256).
	macSize = sha256.Size
	// tokenSize is the size of a session token (an HMAC-SHA-256).
	tokenSize = sha256.Size
)

// The frame bodies, one append and one parse function per kind, in the
// order of the kinds. An append function appends the body, kind byte
// first; appendFrame (or appendWhole) puts the length in front. A parse
// function takes the body after its kind byte and fails, wrapping
// ErrMalformed, unless it is consumed whole. They have no side effects:
// what a frame means is decided by its handler.

// appendWhole appends a whole frame, length first, whose body append
// appends: the writer's form, which allocates nothing.
func appendWhole(dst []byte, body []byte) []byte {
	start := len(dst)
	dst = append(dst, 0)
	dst = append(dst, body...)
	return fixLength(dst, start)
}

// rejectBody is an acceptor's refusal: a reject code, its uid and why.
type rejectBody struct {
	code byte
	uid  NodeUID
	text string
}

func appendReject(b []byte, r rejectBody) []byte {
	b = append(b, byte(frameReject), r.code)
	b = append(b, r.uid[:]...)
	return appendString(b, r.text)
}

func parseReject(b []byte) (rejectBody, error) {
	d := decoder{b: b}
	var r rejectBody
	r.code = d.byte()
	copy(r.uid[:], d.take(idSize))
	r.text = d.string()
	return r, d.whole("reject")
}

// tellHeader precedes a tell frame's payload: the target actor and the
// message type, each either a table id or defined inline. An inline
// definition with a nonzero id also enters the table under that id.
type tellHeader struct {
	target       uint64 // table id, 0 if none
	targetInline bool   // path and uuid follow
	path         string
	uuid         UUID
	typ          uint64 // table id, 0 if none
	typInline    bool   // the wire key follows
	key          string
}

// appendTellHeader appends the body of a tell frame up to its payload,
// which the caller appends.
func appendTellHeader(b []byte, h *tellHeader) []byte {
	return appendTellFields(append(b, byte(frameTell)), h)
}

// appendTellFields appends a tell's target and type, as a tell frame (or
// a tell with headers, after them) carries them.
func appendTellFields(b []byte, h *tellHeader) []byte {
	if h.targetInline {
		b = binary.AppendUvarint(b, h.target<<1|1)
		b = appendString(b, h.path)
		b = append(b, h.uuid[:]...)
	} else {
		b = binary.AppendUvarint(b, h.target<<1)
	}
	if h.typInline {
		b = binary.AppendUvarint(b, h.typ<<1|1)
		return appendString(b, h.key)
	}
	return binary.AppendUvarint(b, h.typ<<1)
}

// parseTell parses a tell frame's header into h and returns its payload,
// the rest of the body.
func parseTell(b []byte, h *tellHeader) ([]byte, error) {
	if len(b) >= 2 && b[0] < 0x80 && b[0]&1 == 0 && b[1] < 0x80 && b[1]&1 == 0 {
		// The usual frame: both ids from the tables, each one byte.
		*h = tellHeader{target: uint64(b[0] >> 1), typ: uint64(b[1] >> 1)}
		return b[2:], nil
	}
	d := decoder{b: b}
	t := d.uvarint()
	h.target, h.targetInline = t>>1, t&1 == 1
	if h.targetInline {
		h.path = d.string()
		copy(h.uuid[:], d.take(idSize))
	}
	y := d.uvarint()
	h.typ, h.typInline = y>>1, y&1 == 1
	if h.typInline {
		h.key = d.string()
	}
	if d.err != nil {
		return nil, d.err
	}
	return b[d.off:], nil
}

// watchBody is a watch, an unwatch or (with a reason) a termination: the
// watched actor on the receiving node (watch, unwatch) or on the sending
// node (terminated), and the path of the watcher on the other.
type watchBody struct {
	path    string
	uuid    UUID
	watcher string
	code    byte   // terminated only: the reason code
	text    string // terminated only: the reason text
}

func appendWatch(b []byte, kind frameKind, w watchBody) []byte {
	b = append(b, byte(kind))
	b = appendString(b, w.path)
	b = append(b, w.uuid[:]...)
	b = appendString(b, w.watcher)
	if kind == frameTerminated {
		b = append(b, w.code)
		b = appendString(b, w.text)
	}
	return b
}

func parseWatch(kind frameKind, b []byte) (watchBody, error) {
	d := decoder{b: b}
	var w watchBody
	w.path = d.string()
	copy(w.uuid[:], d.take(idSize))
	w.watcher = d.string()
	if kind == frameTerminated {
		w.code = d.byte()
		w.text = d.string()
	}
	return w, d.whole(kind.String())
}

// resolveBody asks for the actor at path, expecting protocol proto; id
// pairs the answer with the request.
type resolveBody struct {
	id    uint64
	path  string
	proto string
}

func appendResolve(b []byte, r resolveBody) []byte {
	b = append(b, byte(frameResolve))
	b = binary.AppendUvarint(b, r.id)
	b = appendString(b, r.path)
	return appendString(b, r.proto)
}

func parseResolve(b []byte) (resolveBody, error) {
	d := decoder{b: b}
	var r resolveBody
	r.id = d.uvarint()
	r.path = d.string()
	r.proto = d.string()
	return r, d.whole("resolve")
}

// Resolve statuses in a frameResolved. Append only.
const (
	resolveOK byte = iota
	resolveNoSuchActor
	resolveWrongType
)

// appendResolved appends the answer to resolve request id: a status, the
// actor's uuid (zeros when there is none) and its protocol.
func appendResolved(b []byte, id uint64, ans resolveAnswer) []byte {
	b = append(b, byte(frameResolved))
	b = binary.AppendUvarint(b, id)
	b = append(b, ans.status)
	b = append(b, ans.uuid[:]...)
	return appendString(b, ans.proto)
}

func parseResolved(b []byte) (id uint64, ans resolveAnswer, err error) {
	d := decoder{b: b}
	id = d.uvarint()
	ans.status = d.byte()
	copy(ans.uuid[:], d.take(idSize))
	ans.proto = d.string()
	return id, ans, d.whole("resolved")
}

// Bye codes. Append only: values are on the wire.
const (
	byeLeaving   byte = iota // the node is closing
	byeDuplicate             // this connection lost a simultaneous dial
	byeGaveUp                // the sender gave up on the receiver (the text says why): it declared it unreachable, and quarantines it unless exempt
	byeRefused               // the dialer refuses the connection the receiver welcomed (the text says why)
)

// maxByeText bounds the text of a goodbye this node writes.
const maxByeText = 256

// appendBye appends a goodbye: a bye code and a text.
func appendBye(b []byte, code byte, text string) []byte {
	b = append(b, byte(frameBye), code)
	return appendString(b, text)
}

// parseBye returns the bye code and text. The text is optional, for
// older peers that sent the code alone.
func parseBye(b []byte) (code byte, text string, err error) {
	d := decoder{b: b}
	code = d.byte()
	if d.err == nil && d.remaining() > 0 {
		text = d.string()
	}
	return code, text, d.whole("bye")
}

// appendHeartbeat appends a heartbeat: the kind alone.
func appendHeartbeat(b []byte) []byte { return append(b, byte(frameHeartbeat)) }

// parseHeartbeat checks that a heartbeat is empty.
func parseHeartbeat(b []byte) error {
	d := decoder{b: b}
	return d.whole("heartbeat")
}

// appendAck appends an acknowledgement: how many tell frames this side has
// received on the connection.
func appendAck(b []byte, received uint64) []byte {
	b = append(b, byte(frameAck))
	return binary.AppendUvarint(b, received)
}

func parseAck(b []byte) (uint64, error) {
	d := decoder{b: b}
	count := d.uvarint()
	return count, d.whole("ack")
}

// appendResume appends the first frame of a resumed session: how many
// sequenced frames this side has received in the session so far.
func appendResume(b []byte, received uint64) []byte {
	b = append(b, byte(frameResume))
	return binary.AppendUvarint(b, received)
}

func parseResume(b []byte) (uint64, error) {
	d := decoder{b: b}
	count := d.uvarint()
	return count, d.whole("resume")
}

// appendCredit appends a grant of n more messages for the target with
// table id id (in the direction the grant's receiver sends).
func appendCredit(b []byte, id uint32, n uint64) []byte {
	b = append(b, byte(frameCredit))
	b = binary.AppendUvarint(b, uint64(id))
	return binary.AppendUvarint(b, n)
}

func parseCredit(b []byte) (id, n uint64, err error) {
	d := decoder{b: b}
	id = d.uvarint()
	n = d.uvarint()
	return id, n, d.whole("credit")
}

// appendDraining appends a draining frame: the sender is shutting down
// and takes no new asks (it has no fields).
func appendDraining(b []byte) []byte { return append(b, byte(frameDraining)) }

func parseDraining(b []byte) error {
	d := decoder{b: b}
	return d.whole("draining")
}

// appendShapeFrame appends a shape frame: the wire key, then the shape
// (the rest of the frame).
func appendShapeFrame(b []byte, key string, shape []byte) []byte {
	b = append(b, byte(frameShape))
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = append(b, key...)
	return append(b, shape...)
}

// parseShapeFrame returns a shape frame's key and shape (which aliases b).
func parseShapeFrame(b []byte) (key string, shape []byte, err error) {
	d := decoder{b: b}
	key = d.string()
	if d.err == nil && (len(key) == 0 || len(key) > maxWireKey) {
		d.fail("a wire key of %d bytes in a shape", len(key))
	}
	if d.err != nil {
		return "", nil, d.err
	}
	return key, b[d.off:], nil
}
