//go:build race

package troupe

// raceEnabled: built with the race detector. The writer then writes with
// Write, never writev: the race detector sees a write to a socket and the
// read of it as synchronized only through Write and Read (package
// syscall), so that a message between two nodes of one process orders
// what came before it, as it does in the program.
const raceEnabled = true
