package troupe

import (
	"io"
	"sync"
)

// The read buffer of a connection, which an idle connection gives back.

// idleReadSize is what a connection's reader holds while it waits for
// bytes with nothing buffered after a quiet read: a frame that arrives
// alone and fits (an ask, a reply, a heartbeat) is read and decoded from
// it, and only more than that (or a read that filled it: a stream) takes
// a buffer of readBufferSize from a pool, given back once the reader has
// consumed everything and its last read brought less than this (a stream
// keeps its buffer; a link that falls quiet gives it back at the latest
// with the peer's next heartbeat, even after a last read of exactly this
// size). So an idle association holds this much for reading, not 64 KiB.
const idleReadSize = 1 << 10

var readBuffers = sync.Pool{New: func() any { return new([readBufferSize]byte) }}

// readBuf is a buffered reader in the manner of bufio.Reader (the methods
// frameReader uses, with their meaning), whose buffer is small while it is
// empty.
type readBuf struct {
	src   io.Reader
	buf   []byte                // small[:] or big[:]
	big   *[readBufferSize]byte // from readBuffers, or nil
	r, w  int                   // buf[r:w] is buffered
	last  int                   // bytes the last read from the source brought
	err   error                 // the source's error, returned once the buffer is drained
	small [idleReadSize]byte    // the buffer while nothing more is needed
}

func newReadBuf(src io.Reader) *readBuf {
	b := &readBuf{src: src}
	b.buf = b.small[:]
	return b
}

// Size is the most Peek can return.
func (b *readBuf) Size() int { return readBufferSize }

// Buffered is how many bytes can be read without reading from the source.
func (b *readBuf) Buffered() int { return b.w - b.r }

// fill reads from the source once, after making room: an empty buffer goes
// back to small (its big one to the pool) after a quiet read, and one that
// holds need bytes at most in small stays small, unless its last read
// filled it.
func (b *readBuf) fill(need int) {
	if b.r == b.w {
		b.r, b.w = 0, 0
		if b.last < idleReadSize {
			b.release()
		}
	} else if b.r > 0 {
		b.w = copy(b.buf, b.buf[b.r:b.w])
		b.r = 0
	}
	// The big buffer is taken for a frame that does not fit, a frame
	// left unfinished in a full small buffer, or after a read that filled
	// the small buffer: a stream, whose next read has as much to bring.
	if b.big == nil && (need > len(b.small) || b.w == len(b.small) || b.last == len(b.small)) {
		b.big = readBuffers.Get().(*[readBufferSize]byte)
		copy(b.big[:], b.buf[:b.w])
		b.buf = b.big[:]
	}
	for range 100 {
		n, err := b.src.Read(b.buf[b.w:])
		b.w += n
		b.last = n
		if err != nil {
			b.err = err
			return
		}
		if n > 0 {
			return
		}
	}
	b.err = io.ErrNoProgress
}

// release gives the big buffer back; the buffer must be empty.
func (b *readBuf) release() {
	if b.big != nil {
		readBuffers.Put(b.big)
		b.big, b.buf = nil, b.small[:]
	}
}

// readErr returns the source's error once, as bufio does.
func (b *readBuf) readErr() error {
	err := b.err
	b.err = nil
	return err
}

// Peek returns the next n bytes (n at most Size) without consuming them,
// reading from the source until they are there; fewer with the error that
// stopped it.
func (b *readBuf) Peek(n int) ([]byte, error) {
	for b.w-b.r < n && b.err == nil {
		b.fill(n)
	}
	if b.w-b.r < n {
		return b.buf[b.r:b.w], b.readErr()
	}
	return b.buf[b.r : b.r+n], nil
}

// Discard consumes n buffered bytes.
func (b *readBuf) Discard(n int) {
	b.r += n
}

// ReadByte consumes and returns one byte.
func (b *readBuf) ReadByte() (byte, error) {
	for b.r == b.w {
		if b.err != nil {
			return 0, b.readErr()
		}
		b.fill(1)
	}
	c := b.buf[b.r]
	b.r++
	return c, nil
}

// Read reads into p: what is buffered, or else straight from the source.
func (b *readBuf) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if b.r == b.w {
		if b.err != nil {
			return 0, b.readErr()
		}
		b.r, b.w = 0, 0
		b.release()
		n, err := b.src.Read(p)
		b.last = n
		return n, err
	}
	n := copy(p, b.buf[b.r:b.w])
	b.r += n
	return n, nil
}
