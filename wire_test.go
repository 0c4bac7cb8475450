package troupe

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/wire")

func TestWireValuesArePinned(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	kinds := map[frameKind]uint8{frameHello: 1, frameWelcome: 2, frameReject: 3, frameTell: 4, frameWatch: 5,
		frameUnwatch: 6, frameTerminated: 7, frameResolve: 8, frameResolved: 9, frameBye: 10, frameHeartbeat: 11, frameChallenge: 12, frameProof: 13, frameAck: 14, frameResume: 15, frameTokenChallenge: 20, frameToken: 21}
	for k, v := range kinds {
		if uint8(k) != v {
			t.Errorf("%s = %d, want %d", k, k, v)
		}
	}
	pinned := []struct {
		name      string
		got, want byte
	}{
		{"refNil", refNil, 0}, {"refSender", refSender, 1}, {"refReceiver", refReceiver, 2}, {"refThird", refThird, 3},
		{"refHasUUID", refHasUUID, 0x80}, {"rejectDuplicate", rejectDuplicate, 1}, {"rejectAuth", rejectAuth, 4}, {"rejectQuarantined", rejectQuarantined, 5},
		{"reasonNodeClosed", reasonNodeClosed, 4}, {"reasonOther", reasonOther, 5}, {"reasonFailed", reasonFailed, 6}, {"reasonWatchRefused", reasonWatchRefused, 7}, {"byeDuplicate", byeDuplicate, 1},
		{"resolveWrongType", resolveWrongType, 2}, {"protocolVersion", protocolVersion, 2}, {"rejectVersion", rejectVersion, 3},
	}
	for _, p := range pinned {
		if p.got != p.want {
			t.Errorf("%s = %d, want %d", p.name, p.got, p.want)
		}
	}
	if helloExtSession != 4 || helloExtDial != 5 || helloExtDowned != 6 || tokenSize != 32 {
		t.Errorf("helloExtSession = %d, helloExtDial = %d, helloExtDowned = %d, tokenSize = %d, want 4, 5, 6 and 32", helloExtSession, helloExtDial, helloExtDowned, tokenSize)
	}
	// A downed notice is a uid, with or without a proof; another length
	// is malformed. One without a proof parses with none.
	plain := appendHello(nil, frameHello, &hello{version: protocolVersion, downed: &downedNotice{uid: NodeUID{9}}})
	if back, err := parseHello(plain[1:]); err != nil || back.downed == nil || back.downed.uid != (NodeUID{9}) || back.downed.mac != nil {
		t.Errorf("a downed notice without a proof parses back as %+v (%v)", back, err)
	}
	for _, n := range []int{0, idSize - 1, idSize + 1, idSize + macSize - 1, idSize + macSize + 1} {
		b := appendHello(nil, frameHello, &hello{version: protocolVersion})
		b = append(b[1:len(b)-1], 1, 6, byte(n))
		if _, err := parseHello(append(b, make([]byte, n)...)); !errors.Is(err, ErrMalformed) {
			t.Errorf("a downed notice of %d bytes: %v, want ErrMalformed", n, err)
		}
	}
	// A welcome's dial extension is empty; a hello's number is at least 1.
	for _, tt := range []struct {
		h       hello
		dial    uint64
		ordered bool
	}{{hello{version: protocolVersion, ordered: true}, 0, true}, {hello{version: protocolVersion, dial: 1}, 1, true}, {hello{version: protocolVersion}, 0, false}} {
		back, err := parseHello(appendHello(nil, frameWelcome, &tt.h)[1:])
		if err != nil || back.dial != tt.dial || back.ordered != tt.ordered {
			t.Errorf("%+v parses back as dial %d, ordered %v (%v)", tt.h, back.dial, back.ordered, err)
		}
	}
	for _, bad := range [][]byte{{1, 0}, {2, 1, 0}, {1, 0x80}} { // number 0, a byte after it, a truncated number
		b := appendHello(nil, frameHello, &hello{version: protocolVersion})
		b = append(b[1:len(b)-1], 1, 5)
		if _, err := parseHello(append(b, bad...)); !errors.Is(err, ErrMalformed) {
			t.Errorf("a dial extension %x: %v, want ErrMalformed", bad, err)
		}
	}
	// A refused watch keeps its sentinel and its text across the wire; a
	// code this node does not know reads as text.
	refused := fmt.Errorf("%w: the watched node holds 3 watches", ErrWatchRefused)
	code, text := reasonCode(refused)
	if back := reasonErr(code, text); code != reasonWatchRefused || !errors.Is(back, ErrWatchRefused) || back.Error() != refused.Error() {
		t.Errorf("a refused watch crosses as %d %q and reads back as %v", code, text, back)
	}
	if back := reasonErr(200, "from a newer node"); back == nil || back.Error() != "from a newer node" {
		t.Errorf("an unknown reason code reads as %v", back)
	}
}

// goldenFrames builds one frame of each kind from fixed inputs.
func goldenFrames(t *testing.T) map[string][]byte {
	uid := NodeUID{0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf, 0xb0}
	target := refKey{node: uid, path: "/user/echo", uuid: UUID{0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f}}
	h := &hello{version: protocolVersion, uid: uid, name: "alpha", addrs: []string{"tcp://127.0.0.1:7001", "unix:///run/a.sock"}, appVersion: "1.4.2", headers: true, session: bytes.Repeat([]byte{0x5a}, nonceSize), dial: 300}
	w := *h
	w.appVersion, w.headers, w.session, w.dial = "", false, nil, 0 // (a welcome without extensions)
	o := *h
	o.name, o.addrs, o.flags, o.appVersion, o.observer, o.headers, o.session, o.dial = "troupe-cli", nil, helloCredit|helloDrains|helloShapes, "", true, false, nil, 0
	d := hello{version: protocolVersion, flags: helloProbe, uid: NodeUID{0xb1}, name: "beta", downed: &downedNotice{uid: uid, mac: bytes.Repeat([]byte{0xc3}, macSize)}}
	frame := func(body []byte) []byte { return appendWhole(nil, body) }
	watch := watchBody{path: target.path, uuid: target.uuid, watcher: "/user/watcher"}
	dead := watch
	dead.code, dead.text = reasonOther, "boom"

	a := newAssoc(nil, true, tcpAddr("127.0.0.1:7001"))
	a.n = &Node{cfg: Config{MaxFrameSize: defaultMaxFrameSize}}
	a.peer.uid, a.peer.headers = uid, true
	tellTo := func(msg any, hd ...string) []byte {
		var h Headers
		for i := 0; i+1 < len(hd); i += 2 {
			if h == nil {
				h = Headers{}
			}
			h[hd[i]] = hd[i+1]
		}
		if err := a.sendTellHeadersLocked(&handle{key: target}, typeOf(reflect.TypeOf(msg)), msg, h); err != nil {
			t.Fatal(err)
		}
		out := a.out.take()
		var b []byte
		out.each(func(f []byte) bool { b = append(b, f...); return true })
		return b
	}
	out := map[string][]byte{
		"hello":          appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameHello, h) }),
		"welcome":        appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameWelcome, &w) }),
		"hello-observer": appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameHello, &o) }),
		"hello-downed":   appendFrame(nil, func(b []byte) []byte { return appendHello(b, frameHello, &d) }),
		"reject":         rejectFrame(rejectDuplicate, uid, "the other connection between these nodes wins"),
		"tell-first":     tellTo(count{N: 3}),
		"tell-again":     tellTo(count{N: 3}),
		"tellheaders":    tellTo(count{N: 3}, "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant", "a"),
		"watch":          frame(appendWatch(nil, frameWatch, watch)),
		"unwatch":        frame(appendWatch(nil, frameUnwatch, watch)),
		"terminated":     frame(appendWatch(nil, frameTerminated, dead)),
		"resolve":        frame(appendResolve(nil, resolveBody{id: 1, path: "/user/echo", proto: "x"})),
		"bye":            frame(appendBye(nil, byeLeaving, "")),
		"resolved":       frame(appendResolved(nil, 1, resolveAnswer{status: resolveOK, uuid: target.uuid, proto: "troupe.test.count"})),
		"heartbeat":      frame(appendHeartbeat(nil)),
		"ack":            frame(appendAck(nil, 1025)),
		"credit":         frame(appendCredit(nil, 3, 50)),
		"draining":       frame(appendDraining(nil)),
		"shape":          frame(appendShapeFrame(nil, "troupe.test.count", shapeOf(reflect.TypeFor[count]()))),
		"resume":         frame(appendResume(nil, 70000)),
		"challenge":      frame(appendChallenge(nil, challengeBody{uid: uid, nonce: bytes.Repeat([]byte{0x5a}, nonceSize), mac: bytes.Repeat([]byte{0xc3}, macSize)})),
		"proof":          frame(appendProof(nil, bytes.Repeat([]byte{0xc3}, macSize))),
		"tokenchallenge": frame(appendTokenChallenge(nil, tokenChallenge{uid: uid, nonce: bytes.Repeat([]byte{0x5a}, nonceSize)})),
		"token":          frame(appendToken(nil, bytes.Repeat([]byte{0x7e}, tokenSize))),
	}
	return out
}

func init() { SetWireKey[count]("troupe.test.count") }

func TestGoldenFrames(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	for name, got := range goldenFrames(t) {
		path := filepath.Join("testdata", "wire", name+".hex")
		if *update {
			os.MkdirAll(filepath.Dir(path), 0o755)
			if err := os.WriteFile(path, []byte(hex.EncodeToString(got)+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test -run Golden -update to create it)", err)
		}
		want, err := hex.DecodeString(strings.TrimSpace(string(raw)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s frame:\n got %x\nwant %x", name, got, want)
		}
	}
}

func TestSmallTellIsSmallOnTheWire(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	f := goldenFrames(t)["tell-again"]
	if len(f) > 6 {
		t.Fatalf("a repeated tell of a one-int message takes %d bytes (%x), want at most 6", len(f), f)
	}
}

func TestFrameReaderRejects(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty frame", []byte{0}, ErrMalformed},
		{"too big", []byte{0xff, 0xff, 0xff, 0x7f}, ErrFrameTooBig},
		{"long prefix", []byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, ErrMalformed},
		{"truncated prefix", []byte{0x80}, ErrMalformed},
		{"truncated body", []byte{5, 1, 2}, ErrMalformed},
	}
	for _, tt := range tests {
		fr := newFrameReader(bytes.NewReader(tt.in), 1<<20)
		if _, err := fr.next(); !errors.Is(err, tt.want) {
			t.Errorf("%s: next() = %v, want %v", tt.name, err, tt.want)
		}
	}
	// A body larger than the read buffer still reads.
	big := appendFrame(nil, func(b []byte) []byte { return append(b, bytes.Repeat([]byte{7}, readBufferSize+10)...) })
	fr := newFrameReader(bytes.NewReader(big), 1<<20)
	if b, err := fr.next(); err != nil || len(b) != readBufferSize+10 {
		t.Fatalf("big frame: %d bytes, %v", len(b), err)
	}
}

// FuzzDecodeFrame feeds arbitrary bytes, as a stream of frames after a
// handshake, to an association. It must never panic; every error must say
// the input was malformed.
func FuzzDecodeFrame(f *testing.F) {
	entries, _ := filepath.Glob(filepath.Join("testdata", "wire", "*.hex"))
	for _, e := range entries {
		raw, _ := os.ReadFile(e)
		if b, err := hex.DecodeString(strings.TrimSpace(string(raw))); err == nil {
			f.Add(b)
		}
	}
	n, err := Start(ctxT(f, 5_000_000_000), Config{Logger: quietLogger(), SendQueueLimit: 16})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { n.Close() })
	Spawn(n, "echo", Behavior[count]{Receive: func(*Context[count], count) {}})
	f.Fuzz(func(t *testing.T, in []byte) {
		a := newAssoc(n, false, Addr{})
		a.peer.uid = NodeUID{0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf, 0xb0}
		a.life.state = assocUp
		fr := newFrameReader(bytes.NewReader(in), 1<<16)
		for {
			body, err := fr.next()
			if err != nil {
				if err.Error() != "EOF" && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrFrameTooBig) {
					t.Fatalf("frame error %v is neither malformed nor too big", err)
				}
				return
			}
			kind := frameKind(body[0])
			if kind == frameHello || kind == frameWelcome {
				parseHello(body[1:])
				continue
			}
			if kind == frameBye {
				continue // would end the association
			}
			if _, err := a.rd.handleFrame(kind, body[1:]); err != nil {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("%s frame error %v does not wrap ErrMalformed", kind, err)
				}
				return
			}
		}
	})
}

// claimReader serves a frame's length prefix and a few of its bytes, then
// records how large a buffer the frame reader offers for the rest.
type claimReader struct {
	data    []byte
	offered int // the largest buffer offered once the data ran out
}

func (r *claimReader) Read(p []byte) (int, error) {
	if len(r.data) > 0 {
		n := copy(p, r.data)
		r.data = r.data[n:]
		return n, nil
	}
	r.offered = max(r.offered, len(p))
	return 0, io.EOF
}

func TestClaimedFrameLengthIsNotAllocated(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	for _, claim := range []int{readBufferSize + 1, 1 << 20, defaultMaxFrameSize} {
		r := &claimReader{data: append(binary.AppendUvarint(nil, uint64(claim)), make([]byte, 10)...)}
		fr := newFrameReader(r, defaultMaxFrameSize)
		if _, err := fr.next(); !errors.Is(err, ErrMalformed) {
			t.Fatalf("claim %d: %v, want a truncated frame", claim, err)
		}
		if r.offered > readBufferSize || cap(fr.scratch) > readBufferSize {
			t.Fatalf("claim %d with 10 bytes sent: a %d-byte read and a %d-byte buffer", claim, r.offered, cap(fr.scratch))
		}
	}
	// A frame that really is large still arrives whole.
	body := make([]byte, 3<<20)
	for i := range body {
		body[i] = byte(i * 7)
	}
	fr := newFrameReader(bytes.NewReader(append(binary.AppendUvarint(nil, uint64(len(body))), body...)), defaultMaxFrameSize)
	got, err := fr.next()
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("a 3 MiB frame: %v, equal %v", err, bytes.Equal(got, body))
	}
}

// TestFrameBodiesParseBack parses every frame kind's golden vector with its
// parse function and checks that it gives back what built it, and that a
// byte more or a byte less is refused.
func TestFrameBodiesParseBack(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	frames := goldenFrames(t)
	body := func(name string) []byte {
		fr := newFrameReader(bytes.NewReader(frames[name]), defaultMaxFrameSize)
		b, err := fr.next()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return append([]byte(nil), b[1:]...)
	}
	uid := NodeUID{0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf, 0xb0}
	uuid := UUID{0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f}
	sprint := func(v ...any) string { return strings.TrimSuffix(fmt.Sprintln(v...), "\n") }
	parsers := map[string]func(b []byte) (any, error){
		"hello": func(b []byte) (any, error) {
			h, err := parseHello(b)
			if err != nil {
				return nil, err
			}
			return sprint(h.name, strings.Join(h.addrs, ","), h.appVersion, h.headers, h.session[0], len(h.session), h.dial, h.ordered), nil
		},
		"welcome": func(b []byte) (any, error) { h, err := parseHello(b); return h.uid, err },
		"hello-observer": func(b []byte) (any, error) {
			h, err := parseHello(b)
			return sprint(h.name, h.observer, h.flags&helloResumable != 0, h.appVersion == ""), err
		},
		"hello-downed": func(b []byte) (any, error) {
			h, err := parseHello(b)
			if err != nil || h.downed == nil {
				return nil, err
			}
			return sprint(h.flags == helloProbe, h.downed.uid == uid, h.downed.mac[0], len(h.downed.mac)), nil
		},
		"reject": func(b []byte) (any, error) { return parseReject(b) },
		"tell-first": func(b []byte) (any, error) {
			var h tellHeader
			p, err := parseTell(b, &h)
			return sprint(h.target, h.targetInline, h.path, h.typ, h.typInline, h.key, len(p)), err
		},
		"tell-again": func(b []byte) (any, error) {
			var h tellHeader
			p, err := parseTell(b, &h)
			return sprint(h.target, h.targetInline, h.typ, h.typInline, len(p)), err
		},
		"tellheaders": func(b []byte) (any, error) {
			hd, rest, err := parseHeaders(b)
			if err != nil {
				return nil, err
			}
			var h tellHeader
			p, err := parseTell(rest, &h)
			return sprint(hd.Keys(), hd["traceparent"], hd["tenant"], h.target, h.targetInline, h.typ, h.typInline, len(p)), err
		},
		"watch":      func(b []byte) (any, error) { return parseWatch(frameWatch, b) },
		"unwatch":    func(b []byte) (any, error) { return parseWatch(frameUnwatch, b) },
		"terminated": func(b []byte) (any, error) { return parseWatch(frameTerminated, b) },
		"resolve":    func(b []byte) (any, error) { return parseResolve(b) },
		"resolved": func(b []byte) (any, error) {
			id, ans, err := parseResolved(b)
			return sprint(id, ans.status, ans.uuid == uuid, ans.proto), err
		},
		"bye":       func(b []byte) (any, error) { c, _, err := parseBye(b); return c, err },
		"heartbeat": func(b []byte) (any, error) { return nil, parseHeartbeat(b) },
		"challenge": func(b []byte) (any, error) {
			c, err := parseChallenge(b)
			if err != nil {
				return nil, err
			}
			return sprint(c.uid == uid, c.nonce[0], len(c.nonce), c.mac[0], len(c.mac)), err
		},
		"proof": func(b []byte) (any, error) {
			m, err := parseProof(b)
			if err != nil {
				return nil, err
			}
			return sprint(m[0], len(m)), nil
		},
		"tokenchallenge": func(b []byte) (any, error) {
			c, err := parseTokenChallenge(b)
			if err != nil {
				return nil, err
			}
			return sprint(c.uid == uid, c.nonce[0], len(c.nonce)), nil
		},
		"token": func(b []byte) (any, error) {
			tok, err := parseToken(b)
			if err != nil {
				return nil, err
			}
			return sprint(tok[0], len(tok)), nil
		},
		"ack":    func(b []byte) (any, error) { return parseAck(b) },
		"resume": func(b []byte) (any, error) { return parseResume(b) },
		"credit": func(b []byte) (any, error) {
			id, n, err := parseCredit(b)
			return sprint(id, n), err
		},
		"draining": func(b []byte) (any, error) { return nil, parseDraining(b) },
		"shape": func(b []byte) (any, error) {
			key, shape, err := parseShapeFrame(b)
			if err == nil {
				_, err = parseShape(shape)
			}
			return sprint(key, shape), err
		},
	}
	watch := watchBody{path: "/user/echo", uuid: uuid, watcher: "/user/watcher"}
	want := map[string]any{
		"hello":          "alpha tcp://127.0.0.1:7001,unix:///run/a.sock 1.4.2 true 90 32 300 true",
		"welcome":        uid,
		"hello-observer": "troupe-cli true false true",
		"hello-downed":   sprint(true, true, 0xc3, macSize),
		"reject":         rejectBody{code: rejectDuplicate, uid: uid, text: "the other connection between these nodes wins"},
		"tell-first":     "1 true /user/echo 1 true troupe.test.count 1",
		"tell-again":     "1 false 1 false 1",
		"tellheaders":    "[tenant traceparent] 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 a 1 false 1 false 1",
		"watch":          watch,
		"unwatch":        watch,
		"terminated":     watchBody{path: "/user/echo", uuid: uuid, watcher: "/user/watcher", code: reasonOther, text: "boom"},
		"resolve":        resolveBody{id: 1, path: "/user/echo", proto: "x"},
		"resolved":       "1 0 true troupe.test.count",
		"bye":            byeLeaving,
		"heartbeat":      nil,
		"challenge":      sprint(true, 0x5a, nonceSize, 0xc3, macSize),
		"proof":          sprint(0xc3, macSize),
		"tokenchallenge": sprint(true, 0x5a, nonceSize),
		"token":          sprint(0x7e, tokenSize),
		"ack":            uint64(1025),
		"resume":         uint64(70000),
		"credit":         sprint(uint64(3), uint64(50)),
		"draining":       nil,
		"shape":          sprint("troupe.test.count", []byte{shapeStruct, 1, 1, 'N', shapeInt}),
	}
	if len(parsers) != len(frames) {
		t.Fatalf("%d parsers for %d golden frames", len(parsers), len(frames))
	}
	for name, parse := range parsers {
		b := body(name)
		got, err := parse(b)
		if err != nil || !reflect.DeepEqual(got, want[name]) {
			t.Errorf("%s: parsed %#v, %v; want %#v", name, got, err, want[name])
		}
		if strings.HasPrefix(name, "tell") {
			continue // the payload is the rest of the body: no byte is extra
		}
		if _, err := parse(append(b, 0)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s with a byte more: %v, want ErrMalformed", name, err)
		}
		if len(b) > 0 && name != "bye" {
			if _, err := parse(b[:len(b)-1]); !errors.Is(err, ErrMalformed) {
				t.Errorf("%s with a byte less: %v, want ErrMalformed", name, err)
			}
		}
	}
}

// TestHelloExtensions: a hello's extensions carry the app version; a tag
// from a later version is skipped; too many extensions, or an app version
// past its bound, are malformed; a hello of version 1 is refused with a
// text naming both versions.
func TestHelloExtensions(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	base := func(ext ...byte) []byte {
		b := appendHello(nil, frameHello, &hello{version: protocolVersion, uid: NodeUID{7}, name: "x"})
		return append(b[1:len(b)-1], ext...) // (without the kind byte, and the empty extension count)
	}
	cases := []struct {
		name    string
		body    []byte
		version string
		err     string
	}{
		{"none", base(0), "", ""},
		{"app version", base(1, 1, 3, 'v', '1', '0'), "v10", ""},
		{"a later tag first", base(2, 9, 2, 0xff, 0xfe, 1, 1, 'z'), "z", ""},
		{"seventeen", base(append([]byte{17}, bytes.Repeat([]byte{9, 0}, 17)...)...), "", "17 handshake extensions"},
		{"a long app version", base(append([]byte{1, 1, 129, 1}, bytes.Repeat([]byte{'v'}, 129)...)...), "", "app version of 129 bytes"},
		{"truncated", base(1, 1, 5, 'v'), "", "exceeds"},
		{"trailing", base(0, 0), "", "after handshake"},
	}
	for _, c := range cases {
		h, err := parseHello(c.body)
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: error %v, want one with %q", c.name, err, c.err)
		case c.err == "" && h.appVersion != c.version:
			t.Errorf("%s: app version %q, want %q", c.name, h.appVersion, c.version)
		}
	}
	old := appendHello(nil, frameHello, &hello{version: 1, uid: NodeUID{7}, name: "old"})
	if _, err := parseHello(old[1:]); err == nil || !strings.Contains(err.Error(), "protocol version 1, want 2") {
		t.Fatalf("a version 1 hello: %v", err)
	}
}
