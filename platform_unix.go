//go:build unix

package troupe

import (
	"errors"
	"io/fs"
	"os"
	"syscall"
)

// isRefused reports whether a dial failed because nothing listens at the
// address: a refused TCP connection or a missing Unix socket file.
func isRefused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}

// isAddrInUse reports whether a listen failed because the address is taken.
func isAddrInUse(err error) bool { return errors.Is(err, syscall.EADDRINUSE) }

// errAddrInUse is the error a live Unix socket file gives a second
// listener.
var errAddrInUse error = syscall.EADDRINUSE

// fileOwner returns the uid that owns fi, and whether the platform says.
func fileOwner(fi fs.FileInfo) (int, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}

// flock takes (or, with lock false, releases) an exclusive advisory lock
// on f.
func flock(f *os.File, lock bool) error {
	how := syscall.LOCK_EX
	if !lock {
		how = syscall.LOCK_UN
	}
	return syscall.Flock(int(f.Fd()), how)
}

// tryFlock takes an exclusive advisory lock on f, or fails at once if
// another holds it.
func tryFlock(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
}
