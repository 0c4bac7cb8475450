//go:build !unix

package troupe

// processGone reports whether no process pid exists; here it cannot tell
// (see exitWithParent).
func processGone(pid int) bool { return false }
