//go:build !race

package troupe_test

// raceBuild: see race_on_test.go.
const raceBuild = false
