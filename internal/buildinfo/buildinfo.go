// Package buildinfo reads, from the running binary's build information,
// the versions of sluice and asynq it was built with: what `--version`
// prints and sluice_build_info reports.
package buildinfo

import (
	"runtime/debug"
)

// Module paths whose versions are read.
const (
	SluicePath = "github.com/sluicehq/sluice"
	AsynqPath  = "github.com/hibiken/asynq"
)

// Devel is the version of a build with no module version: built from a
// checkout with no version control information.
const Devel = "(devel)"

// Sluice returns sluice's version in this binary: the tag it was installed
// at (go install github.com/sluicehq/sluice/cmd/worker@v1.2.3 gives
// v1.2.3), the pseudo-version of a build in a git checkout
// (v0.0.0-20261207…-fda075b…, +dirty with local changes), the version an
// application's go.mod requires when sluice is a library, or "(devel)"
// followed by the commit, when known.
func Sluice() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Devel
	}
	return sluiceOf(bi)
}

func sluiceOf(bi *debug.BuildInfo) string {
	v := bi.Main.Version
	if bi.Main.Path != SluicePath {
		v = depVersion(bi, SluicePath)
	}
	if v != "" && v != Devel {
		return v
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			return Devel + " " + s.Value
		}
	}
	return Devel
}

// Asynq returns the version of asynq linked into this binary; "" when
// the build information does not say.
func Asynq() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	return depVersion(bi, AsynqPath)
}

func depVersion(bi *debug.BuildInfo, path string) string {
	for _, d := range bi.Deps {
		if d.Path == path {
			if d.Replace != nil && d.Replace.Version != "" {
				return d.Replace.Version
			}
			return d.Version
		}
	}
	return ""
}
