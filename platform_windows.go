//go:build windows

package troupe

import (
	"errors"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/windows"
)

// isRefused reports whether a dial failed because nothing listens at the
// address: a refused TCP connection or a missing Unix socket file.
func isRefused(err error) bool {
	return errors.Is(err, windows.WSAECONNREFUSED) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, fs.ErrNotExist)
}

// isAddrInUse reports whether a listen failed because the address is taken.
func isAddrInUse(err error) bool {
	return errors.Is(err, windows.WSAEADDRINUSE) || errors.Is(err, syscall.EADDRINUSE)
}

// errAddrInUse is the error a live Unix socket file gives a second
// listener.
var errAddrInUse error = windows.WSAEADDRINUSE

// fileOwner returns the uid that owns fi, and whether the platform says:
// Windows has no uids, so it never does.
func fileOwner(fs.FileInfo) (int, bool) { return 0, false }

// flock takes (or, with lock false, releases) an exclusive lock on f.
func flock(f *os.File, lock bool) error {
	h := windows.Handle(f.Fd())
	ol := new(windows.Overlapped)
	if !lock {
		return windows.UnlockFileEx(h, 0, 1, 0, ol)
	}
	return windows.LockFileEx(h, windows.LOCKFILE_EXCLUSIVE_LOCK, 0, 1, 0, ol)
}

// tryFlock takes an exclusive lock on f, or fails at once if another
// holds it.
func tryFlock(f *os.File) error {
	return windows.LockFileEx(windows.Handle(f.Fd()), windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, new(windows.Overlapped))
}
