package troupe

import "sync"

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
	n          int
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
}

// take empties q and returns what it held.
func (q *recQueue) take() recQueue {
	out := *q
	*q = recQueue{}
	return out
}

// appendQueue moves everything in o to the end of q.
func (q *recQueue) appendQueue(o recQueue) {
	if o.head == nil {
		return
	}
	if q.tail == nil {
		*q = o
		return
	}
	q.tail.next = o.head
	q.tail = o.tail
	q.n += o.n
}

// each calls f for every record in order, then recycles the chunks.
func (q recQueue) each(f func(r *outRec)) {
	for c := q.head; c != nil; {
		for i := 0; i < c.n; i++ {
			f(&c.recs[i])
			c.recs[i] = outRec{}
		}
		next := c.next
		c.n, c.next = 0, nil
		chunkPool.Put(c)
		c = next
	}
}
