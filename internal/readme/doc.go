// Package readme holds the test that runs the commands of the README, so
// that what the README says stays what the binaries do. It has no code.
package readme
