//go:build race

package troupe

// raceEnabled: the tests run under the race detector.
const raceEnabled = true
