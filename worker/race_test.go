//go:build race

package worker_test

// raceEnabled builds the fleet tests' worker program with -race too, so that
// it links against the packages the test binary already compiled.
const raceEnabled = true
