//go:build !race

package worker_test

const raceEnabled = false
