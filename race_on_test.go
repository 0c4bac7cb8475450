//go:build race

package troupe_test

// raceBuild: the tests run with the race detector. The tests that build
// and run programs with the go command skip then: the detector adds
// nothing to a build, and a build beside the suite is two cores' worth
// of work the suite's timing-sensitive tests compete with. .ci/run runs
// them in a step of their own, without it.
const raceBuild = true
