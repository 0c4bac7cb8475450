//go:build !race

package troupe

// raceEnabled: built with the race detector (see race_on.go).
const raceEnabled = false
