//go:build unix

package troupe

import (
	"errors"
	"syscall"
)

// processGone reports whether no process pid exists (see exitWithParent).
func processGone(pid int) bool { return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) }
