//go:build !race || !(amd64 || arm64)

package troupe

// getg identifies the calling goroutine for the lock order's checks (see
// lockrank.go): here, where no assembly reads the runtime's g, by its id.
func getg() uintptr { return uintptr(goid()) }

// getgReused: a goroutine id is never reused (see drop, lockrank.go).
const getgReused = false
