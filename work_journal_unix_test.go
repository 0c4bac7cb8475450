//go:build unix

package troupe

import (
	"reflect"
	"syscall"
	"testing"
)

// A journal's lock is released when the journal closes, even while
// another descriptor of its LOCK file is open: a child process forked
// meanwhile holds one until it execs (any process test running beside a
// producer). Before, the next producer of the directory could find it in
// use by the one that had closed.
func TestJournalCloseReleasesItsLockAtOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	mt := typeOf(reflect.TypeFor[testPing]())
	j, _, _, err := openJournal(dir, false, mt)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := syscall.Dup(int(j.lock.Fd())) // what a fork would hold
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := j.close(); err != nil {
		t.Fatal(err)
	}
	j, _, _, err = openJournal(dir, false, mt)
	if err != nil {
		t.Fatalf("open after close: %v", err)
	}
	j.close()
}
