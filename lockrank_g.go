//go:build race && (amd64 || arm64)

package troupe

// getg returns the runtime's g of the calling goroutine (lockrank_amd64.s,
// lockrank_arm64.s): what identifies a goroutine to the lock order's
// checks in race builds, in a nanosecond (see lockrank.go).
func getg() uintptr

// getgReused: the runtime reuses a g (see drop, lockrank.go).
const getgReused = true
