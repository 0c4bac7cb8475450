package troupe

import "testing"

// TestRecQueueKeepsOrderAcrossChunks pushes, takes and appends queues that
// span several chunks, and checks every record comes out once, in order.
func TestRecQueueKeepsOrderAcrossChunks(t *testing.T) {
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
