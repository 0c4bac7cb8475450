package troupe

import (
	"encoding/binary"
	"sync"
)

// chunkSize is how many records one chunk of a send queue holds.
const chunkSize = 128

// recChunk is a block of a send queue. Chunks are recycled, so a busy
// association queues without allocating and without ever copying a large
// slice to grow it.
type recChunk struct {
	recs [chunkSize]outRec
	n    int
	next *recChunk
}

var chunkPool = sync.Pool{New: func() any { return new(recChunk) }}

// recQueue is a FIFO of records made of chunks. It is not safe for
// concurrent use; the association's lock guards it.
type recQueue struct {
	head, tail *recChunk
	hoff       int // where the first record is in head
	n          int
	// answers and answerBytes count the answers to the peer's requests
	// among the records (see assoc.answer): their size is known, and
	// they count against answerBudget while they wait here too.
	answers, answerBytes int
}

func (q *recQueue) len() int { return q.n }

func (q *recQueue) push(r outRec) {
	if q.tail == nil || q.tail.n == chunkSize {
		c := chunkPool.Get().(*recChunk)
		if q.tail == nil {
			q.head = c
		} else {
			q.tail.next = c
		}
		q.tail = c
	}
	q.tail.recs[q.tail.n] = r
	q.tail.n++
	q.n++
	if b, ok := r.msg.(answerFrame); ok {
		q.answers++
		q.answerBytes += len(b)
	}
}

// take empties q and returns what it held.
func (q *recQueue) take() recQueue {
	out := *q
	*q = recQueue{}
	return out
}

// peek returns the first record (q not empty).
func (q *recQueue) peek() *outRec { return &q.head.recs[q.hoff] }

// pop removes the first record (q not empty).
func (q *recQueue) pop() {
	if b, ok := q.head.recs[q.hoff].msg.(answerFrame); ok {
		q.answers--
		q.answerBytes -= len(b)
	}
	q.head.recs[q.hoff] = outRec{}
	q.hoff++
	q.n--
	if q.hoff == q.head.n {
		c := q.head
		q.head, q.hoff = c.next, 0
		if q.head == nil {
			q.tail = nil
		}
		c.n, c.next = 0, nil
		chunkPool.Put(c)
	}
}

// appendQueue moves everything in o to the end of q.
func (q *recQueue) appendQueue(o recQueue) {
	if o.head == nil {
		return
	}
	if o.hoff > 0 {
		// Only q's own head may start past its first record.
		h := o.head
		copy(h.recs[:], h.recs[o.hoff:h.n])
		clear(h.recs[h.n-o.hoff : h.n])
		h.n -= o.hoff
		o.hoff = 0
	}
	if q.tail == nil {
		*q = o
		return
	}
	q.tail.next = o.head
	q.tail = o.tail
	q.n += o.n
	q.answers += o.answers
	q.answerBytes += o.answerBytes
}

// each calls f for every record in order, then recycles the chunks.
func (q recQueue) each(f func(r *outRec)) {
	start := q.hoff
	for c := q.head; c != nil; {
		for i := start; i < c.n; i++ {
			f(&c.recs[i])
			c.recs[i] = outRec{}
		}
		next := c.next
		c.n, c.next = 0, nil
		chunkPool.Put(c)
		c, start = next, 0
	}
}

// Encoded frames. A sender encodes its message on its own goroutine into
// the association's frameChain (assoc.out); the writer takes the chain,
// copies it into the chain of frames the peer has not yet acknowledged
// (assoc.unacked) and writes it. Both hold bytes only: no boxed values
// for the garbage collector to scan, and memory close to the encoded
// size of what they hold.

// blockSize is the size of a pooled block of a frame chain. A frame that
// does not fit in the room its tail block has left starts a new block; a
// frame larger than a block gets a block of its own, of its size, which
// is not pooled.
const blockSize = 64 << 10

// frameBlock is one block of a frame chain: whole frames, back to back,
// and how many (of them tells) it holds from where its chain starts.
type frameBlock struct {
	b             []byte
	next          *frameBlock
	frames, tells int
	answers       int // bytes of answers to the peer's requests (see assoc.answer)
}

var blockPool = sync.Pool{New: func() any { return &frameBlock{b: make([]byte, 0, blockSize)} }}

// frameChain is a FIFO of encoded frames (each a uvarint length and a
// body, kind byte first) in blocks; a frame never spans two blocks. It
// is not safe for concurrent use; the association's lock guards it.
type frameChain struct {
	head, tail *frameBlock
	off        int // where the first frame starts in head
	bytes      int // bytes held, from off
	frames     int // frames held
	tells      int // tell frames among them
	// answers counts the bytes of answers to the peer's requests while
	// they wait to be written (maintained by commit, takePrefix, take
	// and appendChain only: the chain of unacknowledged frames ignores it).
	answers int
}

// room returns the tail block's bytes with room for a frame of up to n
// bytes appended, to be handed back through commit.
func (c *frameChain) room(n int) []byte {
	if c.tail == nil || cap(c.tail.b)-len(c.tail.b) < n {
		var b *frameBlock
		if n <= blockSize {
			b = blockPool.Get().(*frameBlock)
		} else {
			b = &frameBlock{b: make([]byte, 0, n)}
		}
		if c.tail == nil {
			c.head, c.off = b, 0
		} else {
			c.tail.next = b
		}
		c.tail = b
	}
	return c.tail.b
}

// commitAnswer is commit for an answer to one of the peer's requests.
func (c *frameChain) commitAnswer(b []byte) {
	n := len(b) - len(c.tail.b)
	c.answers += n
	c.tail.answers += n
	c.commit(b, false)
}

// commit stores b, which room returned with one frame appended.
func (c *frameChain) commit(b []byte, tell bool) {
	c.bytes += len(b) - len(c.tail.b)
	c.frames++
	c.tail.frames++
	if tell {
		c.tells++
		c.tail.tells++
	}
	c.tail.b = b
}

// takePrefix removes and returns the blocks from the front of c that
// hold at most max bytes together, or the first block alone when it
// holds more: a write never takes past the room the window has left by
// more than one block.
func (c *frameChain) takePrefix(max int) frameChain {
	var p frameChain
	var last *frameBlock
	size := -c.off
	for b := c.head; b != nil; b = b.next {
		if last != nil && size+len(b.b) > max {
			break
		}
		size += len(b.b)
		p.frames += b.frames
		p.tells += b.tells
		p.answers += b.answers
		last = b
	}
	if last == nil || last == c.tail {
		return c.take()
	}
	p.head, p.tail, p.off, p.bytes = c.head, last, c.off, size
	c.head, c.off = last.next, 0
	last.next = nil
	c.bytes -= size
	c.frames -= p.frames
	c.tells -= p.tells
	c.answers -= p.answers
	return p
}

// link appends b, whose frames from off on are c's now, as a block: the
// bytes, frames and tells it adds to c are the caller's to count.
func (c *frameChain) link(b *frameBlock, off int) {
	b.next = nil
	if c.tail == nil {
		c.head, c.tail, c.off = b, b, off
		return
	}
	if off > 0 {
		b.b = b.b[off:]
	}
	c.tail.next = b
	c.tail = b
}

// take empties c and returns what it held.
func (c *frameChain) take() frameChain {
	out := *c
	*c = frameChain{}
	return out
}

// appendChain moves everything in o to the end of c.
func (c *frameChain) appendChain(o frameChain) {
	if o.head == nil {
		return
	}
	if o.off > 0 {
		o.head.b = o.head.b[o.off:] // (only a chain's head has an offset)
	}
	if c.tail == nil {
		o.off = 0
		*c = o
		return
	}
	c.tail.next = o.head
	c.tail = o.tail
	c.bytes += o.bytes
	c.frames += o.frames
	c.tells += o.tells
	c.answers += o.answers
}

// buffers appends the chain's bytes to v, a block a buffer, for one
// vectored write.
func (c *frameChain) buffers(v [][]byte) [][]byte {
	off := c.off
	for b := c.head; b != nil; b = b.next {
		if len(b.b) > off {
			v = append(v, b.b[off:])
		}
		off = 0
	}
	return v
}

// each calls f with every frame (length prefix included) in order, until
// f returns false.
func (c *frameChain) each(f func(frame []byte) bool) {
	off := c.off
	for b := c.head; b != nil; b = b.next {
		for off < len(b.b) {
			n := frameLen(b.b[off:])
			if !f(b.b[off : off+n]) {
				return
			}
			off += n
		}
		off = 0
	}
}

// drop removes frames from the front of c until skip says stop, and hands
// the blocks it empties to free. skip is called with each frame's kind in
// turn and says whether that frame goes.
func (c *frameChain) drop(skip func(kind frameKind) bool, free func(*frameBlock)) {
	for c.head != nil {
		b := c.head
		for c.off < len(b.b) {
			f := b.b[c.off:]
			n, body := int(f[0])+1, 1 // a length below 128 is one byte
			if f[0] >= 0x80 {
				n, body = frameLen(f), frameBodyAt(f)
			}
			kind := frameKind(f[body])
			if !skip(kind) {
				return
			}
			c.off += n
			c.bytes -= n
			c.frames--
			b.frames--
			if kind.isTell() {
				c.tells--
				b.tells--
			}
		}
		if b == c.tail {
			b.b = b.b[:0] // an empty tail stays, to be filled again
			b.frames, b.tells, b.answers = 0, 0, 0
			c.off = 0
			return
		}
		c.head, c.off = b.next, 0
		free(b)
	}
}

// recycle puts a block back in the pool if it has the pooled size.
func recycle(b *frameBlock) {
	if cap(b.b) != blockSize {
		return // grown by a large frame: let it go
	}
	b.b, b.next, b.frames, b.tells, b.answers = b.b[:0], nil, 0, 0, 0
	blockPool.Put(b)
}

// frameLen is the size of the encoded frame that starts f, length
// prefix included. f holds a whole frame this node encoded.
func frameLen(f []byte) int {
	size, k := binary.Uvarint(f)
	return k + int(size)
}

// frameBodyAt is where the body of the frame that starts f begins.
func frameBodyAt(f []byte) int {
	_, k := binary.Uvarint(f)
	return k
}
