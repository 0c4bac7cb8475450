package troupe

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
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
