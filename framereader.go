package troupe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Reading frames off a connection: the length prefix checked before
// anything is allocated, frames cut from the read buffer's window without
// a copy, and a frame larger than the buffer read in chunks as its bytes
// arrive. wire.go has each frame's layout.

// ErrFrameTooBig is wrapped by the error that closes an association whose
// peer announced a frame larger than [Config.MaxFrameSize]. Nothing is
// allocated for such a frame.
var ErrFrameTooBig = errors.New("troupe: frame too big")

// frameReader reads length-prefixed frames from a connection. Frames that
// lie whole in what the buffer holds are cut from a window on it (win,
// taken by one Peek) without a call into bufio each; took bytes of the
// window have been returned, and are discarded before the next read.
type frameReader struct {
	r       *readBuf
	max     int
	scratch []byte // for frames larger than the read buffer
	win     []byte
	took    int
	// the next frame's place in the window, as inWindow found it (peeked
	// set), for next to take without looking again
	peeked       bool
	peekN, peekK int
}

func newFrameReader(r io.Reader, max int) *frameReader {
	return &frameReader{r: newReadBuf(r), max: max}
}

// next returns the body of the next frame. The slice is valid only until
// the next call. io.EOF means the peer closed cleanly between frames.
func (fr *frameReader) next() ([]byte, error) {
	size, k := fr.peekN, fr.peekK
	if !fr.peeked {
		size, k = fr.inWindow()
	}
	fr.peeked = false
	if k > 0 {
		b := fr.win[fr.took+k : fr.took+k+size]
		fr.took += k + size
		return b, nil
	}
	fr.sync()
	if fr.r.Buffered() == 0 {
		fr.scratch = nil // about to wait: an idle reader holds no large frame's buffer
	}
	n, err := fr.length()
	if err != nil {
		return nil, err
	}
	return fr.body(n)
}

// inWindow returns the size of the next frame and of its length prefix
// if the window holds it whole, and it is a frame next may return (not
// empty, not too big); k is 0 if not.
func (fr *frameReader) inWindow() (size, k int) {
	if fr.took == len(fr.win) {
		fr.sync()
		fr.win, _ = fr.r.Peek(fr.r.Buffered())
	}
	w := fr.win[fr.took:]
	if len(w) == 0 {
		return 0, 0
	}
	n, k := uint64(w[0]), 1
	if n >= 0x80 {
		if n, k = binary.Uvarint(w); k <= 0 || k > maxLengthBytes {
			return 0, 0
		}
	}
	if n == 0 || n > uint64(fr.max) || n > uint64(len(w)-k) {
		return 0, 0
	}
	return int(n), k
}

// sync discards the window's returned bytes from the buffer, before the
// buffer is read from.
func (fr *frameReader) sync() {
	if fr.took > 0 {
		fr.r.Discard(fr.took)
	}
	fr.win, fr.took = nil, 0
}

// await waits for the connection when the buffer holds nothing yet,
// from a shallow frame: a reader parked here uses little enough of its
// stack that the collector halves it, and an idle association stays
// cheap. The read's error, if any, is the next call's.
//
//go:noinline
func (fr *frameReader) await() {
	if fr.buffered() > 0 || fr.r.err != nil {
		return
	}
	fr.sync()
	fr.scratch, fr.peeked = nil, false
	fr.r.fill(1)
}

// buffered is how many bytes the buffer holds that no frame returned yet.
func (fr *frameReader) buffered() int { return fr.r.Buffered() - fr.took }

// quiet reports that the next frame waits for the connection, after a
// read that brought little: the link is idle, or nearly.
func (fr *frameReader) quiet() bool { return fr.buffered() == 0 && fr.r.last < idleReadSize }

// maxLengthBytes is the longest length prefix accepted: five uvarint bytes
// hold any frame size up to 32 GiB, far beyond every allowed maximum.
const maxLengthBytes = 5

// length reads a frame's uvarint length prefix: from the buffer in one
// step when it holds the whole prefix, else a byte at a time.
func (fr *frameReader) length() (uint64, error) {
	if b, _ := fr.r.Peek(min(fr.r.Buffered(), maxLengthBytes)); len(b) > 0 {
		if x, k := binary.Uvarint(b); k > 0 {
			fr.r.Discard(k)
			return x, nil
		}
	}
	var x uint64
	for i := 0; i < maxLengthBytes; i++ {
		c, err := fr.r.ReadByte()
		if err != nil {
			if i > 0 && err == io.EOF {
				// The connection ended inside a frame: a broken link,
				// as inside a body (see truncated).
				return 0, fmt.Errorf("%w: truncated length prefix: %w", ErrMalformed, io.ErrUnexpectedEOF)
			}
			return 0, err
		}
		x |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return x, nil
		}
	}
	return 0, fmt.Errorf("%w: length prefix longer than %d bytes", ErrMalformed, maxLengthBytes)
}

// complete reports whether the read buffer holds the next frame whole,
// so that next returns it without waiting for the connection.
func (fr *frameReader) complete() bool {
	fr.peekN, fr.peekK = fr.inWindow()
	fr.peeked = true
	return fr.peekK > 0
}

// maxHelloSize bounds the first frame of a connection.
const maxHelloSize = 16 << 10

// hello reads the first frame of an inbound connection. It checks the
// frame kind and the magic as soon as their bytes arrive, so a client of
// another protocol is turned away without waiting for a whole frame.
func (fr *frameReader) hello() ([]byte, error) {
	fr.sync()
	if fr.r.Buffered() == 0 {
		fr.scratch = nil // about to wait: an idle reader holds no large frame's buffer
	}
	n, err := fr.length()
	if err != nil {
		return nil, err
	}
	if n < uint64(1+len(magic)) || n > maxHelloSize {
		return nil, fmt.Errorf("%w: not a troupe handshake (first frame of %d bytes)", ErrMalformed, n)
	}
	head, err := fr.r.Peek(1 + len(magic))
	if err != nil {
		return nil, truncated(err, int(n), len(head))
	}
	if frameKind(head[0]) != frameHello || string(head[1:]) != magic {
		return nil, fmt.Errorf("%w: not a troupe handshake (starts %q)", ErrMalformed, head)
	}
	return fr.body(n)
}

func (fr *frameReader) body(n uint64) ([]byte, error) {
	if n == 0 {
		return nil, fmt.Errorf("%w: empty frame", ErrMalformed)
	}
	if n > uint64(fr.max) {
		return nil, fmt.Errorf("%w: %d bytes announced, the limit is %d", ErrFrameTooBig, n, fr.max)
	}
	size := int(n)
	if size <= fr.r.Size() {
		b, err := fr.r.Peek(size)
		if err != nil {
			return nil, truncated(err, size, len(b))
		}
		fr.r.Discard(size)
		return b, nil
	}
	// A frame larger than the read buffer is read in chunks, the buffer
	// growing as its bytes arrive (at most doubling), so memory follows
	// what the peer sent, never what it claimed.
	if cap(fr.scratch) > scratchKeep {
		fr.scratch = nil // the last large frame's buffer is not kept
	}
	b := fr.scratch[:0]
	for len(b) < size {
		chunk := min(size-len(b), max(len(b), readBufferSize))
		if cap(b)-len(b) < chunk {
			b = append(b[:len(b):len(b)], make([]byte, chunk)...)[:len(b)]
		}
		got, err := io.ReadFull(fr.r, b[len(b):len(b)+chunk])
		b = b[:len(b)+got]
		if err != nil {
			fr.scratch = b
			return nil, truncated(err, size, len(b))
		}
	}
	fr.scratch = b
	return b, nil
}

// scratchKeep is the largest frame buffer a reader keeps between frames.
const scratchKeep = 1 << 20

func truncated(err error, want, got int) error {
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: truncated frame (%d of %d bytes): %w", ErrMalformed, got, want, io.ErrUnexpectedEOF)
	}
	return err
}
