package troupe

import (
	"encoding/binary"
	"testing"
)

// TestRecQueueKeepsOrderAcrossChunks pushes, takes and appends queues that
// span several chunks, and checks every record comes out once, in order.
func TestRecQueueKeepsOrderAcrossChunks(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	rec := func(i int) outRec { return outRec{msg: i} }
	var q recQueue
	for i := range 3*chunkSize + 5 {
		q.push(rec(i))
	}
	first := q.take()
	if q.len() != 0 || first.len() != 3*chunkSize+5 {
		t.Fatalf("after take: %d left, %d taken", q.len(), first.len())
	}
	var second recQueue
	for i := 3*chunkSize + 5; i < 4*chunkSize+7; i++ {
		second.push(rec(i))
	}
	var empty recQueue
	first.appendQueue(empty) // nothing happens
	first.appendQueue(second)
	var onto recQueue
	onto.appendQueue(first) // onto an empty queue: it becomes first
	if onto.len() != 4*chunkSize+7 {
		t.Fatalf("%d records after appending, want %d", onto.len(), 4*chunkSize+7)
	}
	next := 0
	onto.each(func(r *outRec) {
		if r.msg.(int) != next {
			t.Fatalf("record %d came out as %v", next, r.msg)
		}
		next++
	})
	if next != 4*chunkSize+7 {
		t.Fatalf("each saw %d records", next)
	}
	// Recycled chunks come back empty.
	var again recQueue
	again.push(rec(-1))
	n := 0
	again.each(func(*outRec) { n++ })
	if n != 1 {
		t.Fatalf("a recycled chunk held %d records, want 1", n)
	}
}

// chainFrame is frame number i of a chain under test: a tell frame, or a
// watch frame for every third i, with a body of i%300 bytes (so that
// some lengths take two bytes) that starts with i.
func chainFrame(i int) []byte {
	kind := frameTell
	if i%3 == 0 {
		kind = frameWatch
	}
	body := append([]byte{byte(kind)}, binary.AppendUvarint(nil, uint64(i))...)
	body = append(body, make([]byte, i%300)...)
	return appendWhole(nil, body)
}

// chainNumbers lists the numbers of the frames in c, in order.
func chainNumbers(t *testing.T, c *frameChain) []int {
	t.Helper()
	var got []int
	c.each(func(f []byte) bool {
		body := f[frameBodyAt(f):]
		n, _ := binary.Uvarint(body[1:])
		got = append(got, int(n))
		return true
	})
	return got
}

// TestFrameChainKeepsOrderAcrossBlocks fills a chain over several blocks,
// takes a prefix of it, drops acknowledged frames from the front, appends
// chains with and without an offset, and checks the frames, bytes and
// counts of tells at every step.
func TestFrameChainKeepsOrderAcrossBlocks(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	const total = 3000
	var c frameChain
	size, tells := 0, 0
	for i := range total {
		f := chainFrame(i)
		c.commit(append(c.room(len(f)), f...), f[frameBodyAt(f)] == byte(frameTell))
		size += len(f)
		if i%3 != 0 {
			tells++
		}
	}
	blocks := 0
	for b := c.head; b != nil; b = b.next {
		blocks++
	}
	if blocks < 3 || c.frames != total || c.tells != tells || c.bytes != size {
		t.Fatalf("%d blocks, %d frames (%d tells), %d bytes; want several blocks, %d frames (%d tells), %d bytes", blocks, c.frames, c.tells, c.bytes, total, tells, size)
	}
	front := c.takePrefix(blockSize)
	if front.frames+c.frames != total || front.tells+c.tells != tells || front.bytes+c.bytes != size || front.bytes > blockSize || front.bytes == 0 {
		t.Fatalf("a prefix of %d frames, %d bytes, and %d, %d left", front.frames, front.bytes, c.frames, c.bytes)
	}
	// Acknowledge 700 tells: they go, with the watches before and among them.
	var freed []*frameBlock
	k := 700
	front.appendChain(c.take())
	front.drop(func(kind frameKind) bool {
		if kind != frameTell {
			return true
		}
		if k == 0 {
			return false
		}
		k--
		return true
	}, func(b *frameBlock) { freed = append(freed, b) })
	got := chainNumbers(t, &front)
	if len(got) == 0 || got[0] != 1051 || len(got) != total-1051 || front.frames != len(got) {
		t.Fatalf("after 700 tells acknowledged the chain starts at %v with %d frames (counted %d), want 1051 and %d", got[:min(len(got), 3)], len(got), front.frames, total-1051)
	}
	if len(freed) == 0 || front.off == 0 {
		t.Fatalf("%d blocks freed, head offset %d", len(freed), front.off)
	}
	// A chain with an offset appended to another: the offset is cut.
	var onto frameChain
	onto.commit(append(onto.room(len(chainFrame(1))), chainFrame(1)...), true)
	onto.appendChain(front)
	got = chainNumbers(t, &onto)
	if got[0] != 1 || got[1] != 1051 || got[len(got)-1] != total-1 || onto.frames != len(got) {
		t.Fatalf("appended: %v … %d (%d frames, counted %d)", got[:2], got[len(got)-1], len(got), onto.frames)
	}
	want := 0
	for b := onto.head; b != nil; b = b.next {
		want += b.frames
	}
	if want != onto.frames {
		t.Fatalf("the blocks count %d frames, the chain %d", want, onto.frames)
	}
}

// TestAPrefixNeverPassesItsBound: the writer takes a prefix of what
// waits to be written bounded by the room left in the window, so a
// prefix holds at most the bytes asked for, or the one block at the
// front when that alone is more.
func TestAPrefixNeverPassesItsBound(t *testing.T) {
	t.Parallel()
	checkLeaks(t)
	for _, max := range []int{1, 1000, blockSize - 1, blockSize, blockSize + 1, 3*blockSize + 7, writeChunk} {
		var c frameChain
		size := 0
		for i := 0; size < 2*writeChunk; i++ {
			f := chainFrame(i)
			c.commit(append(c.room(len(f)), f...), f[frameBodyAt(f)] == byte(frameTell))
			size += len(f)
		}
		for c.frames > 0 {
			headBytes := len(c.head.b) - c.off
			before := c.bytes
			p := c.takePrefix(max)
			if p.bytes > max && p.bytes != headBytes {
				t.Fatalf("takePrefix(%d) took %d bytes; the head block holds %d", max, p.bytes, headBytes)
			}
			if p.bytes == 0 || p.bytes+c.bytes != before {
				t.Fatalf("takePrefix(%d) took %d of %d bytes, leaving %d", max, p.bytes, before, c.bytes)
			}
		}
	}
}
