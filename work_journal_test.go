package troupe

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
)

// journalSample is a segment as a producer of testPing writes it: the
// type, three jobs, a confirmation of the second.
func journalSample() []byte {
	mt := typeOf(reflect.TypeFor[testPing]())
	j := &workJournal{mt: mt}
	b := j.header(nil)
	for seq := uint64(1); seq <= 3; seq++ {
		var e encoder
		p, _ := e.payload(nil, mt, testPing{N: int(seq)})
		b = appendJournalRecord(b, 'J', binary.AppendUvarint(nil, seq), p)
	}
	return appendJournalRecord(b, 'C', binary.AppendUvarint(nil, 2))
}

// Whatever a segment holds, opening the journal returns its jobs or an
// error wrapping errJournal, and never panics.
func FuzzJournalSegment(f *testing.F) {
	good := journalSample()
	f.Add(good)
	f.Add(good[:len(good)-5])
	f.Add([]byte{0, 0, 0, 1, 'C', 0, 0, 0, 0})
	mt := typeOf(reflect.TypeFor[testPing]())
	f.Fuzz(func(t *testing.T, seg []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "0000000000000001.journal"), seg, 0o600); err != nil {
			t.Fatal(err)
		}
		j, jobs, top, err := openJournal(dir, false, mt)
		if err != nil {
			if !errors.Is(err, errJournal) {
				t.Fatalf("error %v does not wrap errJournal", err)
			}
			return
		}
		defer j.close()
		for _, jj := range jobs {
			if jj.seq > top {
				t.Fatalf("job %d above the top number %d", jj.seq, top)
			}
		}
	})
}

// The sample segment opens to jobs 1 and 3, and a second open finds the
// compacted segment holding just those.
func TestJournalSampleOpens(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "0000000000000001.journal"), journalSample(), 0o600)
	mt := typeOf(reflect.TypeFor[testPing]())
	for range 2 {
		j, jobs, top, err := openJournal(dir, false, mt)
		if err != nil {
			t.Fatal(err)
		}
		if len(jobs) != 2 || jobs[0].seq != 1 || jobs[1].seq != 3 || top != 3 {
			t.Fatalf("jobs %v, top %d; want 1 and 3, top 3", jobs, top)
		}
		j.close()
		segs, _ := filepath.Glob(filepath.Join(dir, "*.journal"))
		if len(segs) != 1 {
			t.Fatalf("segments after opening: %v, want the compacted one", segs)
		}
	}
}

// A record whose length is damaged before the end of the last segment —
// zeroed, or past any record's bound — is damage, not a cut-short tail:
// the journal does not open, rather than drop what follows.
func TestJournalLengthDamageIsNotATail(t *testing.T) {
	t.Parallel()
	mt := typeOf(reflect.TypeFor[testPing]())
	j := &workJournal{mt: mt}
	seg := j.header(nil)
	for seq := uint64(1); seq <= 10; seq++ {
		var e encoder
		p, _ := e.payload(nil, mt, testPing{N: int(seq)})
		seg = appendJournalRecord(seg, 'J', binary.AppendUvarint(nil, seq), p)
	}
	third := 0 // the offset of the third job's record
	for off, k := 0, 0; ; k++ {
		kind, _, next, ok := readJournalRecord(seg, off)
		if !ok {
			t.Fatal("the sample does not read")
		}
		if kind == 'J' && k == 4 { // T, I, J1, J2, J3
			third = off
			break
		}
		off = next
	}
	for name, damage := range map[string]func(b []byte){
		"zeroed":   func(b []byte) { copy(b[third:], []byte{0, 0, 0, 0}) },
		"high bit": func(b []byte) { b[third] |= 0x80 },
		"too long": func(b []byte) { binary.BigEndian.PutUint32(b[third:], maxJournalRecord+1) },
	} {
		dir := t.TempDir()
		b := slices.Clone(seg)
		damage(b)
		os.WriteFile(filepath.Join(dir, "0000000000000001.journal"), b, 0o600)
		if jj, jobs, _, err := openJournal(dir, false, mt); err == nil {
			jj.close()
			t.Errorf("%s length before the end: opened with %d jobs, want an error", name, len(jobs))
		}
	}
}

// A flush that comes after the journal closed (a Send that met Close)
// writes nothing: it does not compact into the directory, which the next
// producer may hold by then.
func TestJournalFlushAfterCloseTouchesNothing(t *testing.T) {
	t.Parallel()
	mt := typeOf(reflect.TypeFor[testPing]())
	dir := t.TempDir()
	payload := func(n int) []byte {
		var e encoder
		b, _ := e.payload(nil, mt, testPing{N: n})
		return b
	}
	j1, _, _, err := openJournal(dir, false, mt)
	if err != nil {
		t.Fatal(err)
	}
	big := slices.Repeat([]byte{1}, 5<<20)
	j1.add(1, big)
	j1.confirm(1)
	j1.close()
	j2, _, _, err := openJournal(dir, false, mt)
	if err != nil {
		t.Fatal(err)
	}
	if err := j2.add(2, payload(2)); err != nil {
		t.Fatal(err)
	}
	if err := j1.flush(0, true); err == nil {
		t.Fatal("a flush of a closed journal succeeded")
	}
	j2.close()
	j3, jobs, _, err := openJournal(dir, false, mt)
	if err != nil {
		t.Fatal(err)
	}
	defer j3.close()
	if len(jobs) != 1 || jobs[0].seq != 2 {
		t.Fatalf("the next producer's journal holds %v, want job 2", jobs)
	}
}

// A compaction that a crash cut short leaves the segment before it (with
// a tail cut short, perhaps) beside the new one, or a temporary file: the
// journal opens from the last whole segment, and removes the rest.
func TestJournalOpensAfterACompactionCutShort(t *testing.T) {
	t.Parallel()
	mt := typeOf(reflect.TypeFor[testPing]())
	dir := t.TempDir()
	g := journalSample() // jobs 1 and 3 live
	os.WriteFile(filepath.Join(dir, "0000000000000001.journal"), g[:len(g)-3], 0o600)
	os.WriteFile(filepath.Join(dir, "0000000000000002.journal"), g, 0o600)
	os.WriteFile(filepath.Join(dir, "0000000000000003.journal.tmp"), g[:10], 0o600)
	j, jobs, _, err := openJournal(dir, false, mt)
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	if len(jobs) != 2 || jobs[0].seq != 1 || jobs[1].seq != 3 {
		t.Fatalf("jobs %v, want 1 and 3", jobs)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*.journal*"))
	if len(left) != 1 {
		t.Fatalf("files left: %v, want the new segment only", left)
	}
}
