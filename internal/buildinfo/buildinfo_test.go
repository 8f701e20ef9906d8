package buildinfo

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSluiceVersion(t *testing.T) {
	t.Parallel()
	rev := []debug.BuildSetting{{Key: "vcs.revision", Value: "fda075b"}}
	for _, tt := range []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{"installed at a tag", debug.BuildInfo{Main: debug.Module{Path: SluicePath, Version: "v1.2.3"}}, "v1.2.3"},
		{"a checkout", debug.BuildInfo{Main: debug.Module{Path: SluicePath, Version: "v0.0.0-20261207231900-fda075b1a2b3+dirty"}, Settings: rev}, "v0.0.0-20261207231900-fda075b1a2b3+dirty"},
		{"no module version, a commit", debug.BuildInfo{Main: debug.Module{Path: SluicePath, Version: Devel}, Settings: rev}, "(devel) fda075b"},
		{"nothing known", debug.BuildInfo{Main: debug.Module{Path: SluicePath}}, Devel},
		{"a library of an application", debug.BuildInfo{Main: debug.Module{Path: "example.com/app", Version: "v9.0.0"}, Deps: []*debug.Module{{Path: SluicePath, Version: "v1.4.0"}}}, "v1.4.0"},
		{"a replaced library", debug.BuildInfo{Main: debug.Module{Path: "example.com/app"}, Deps: []*debug.Module{{Path: SluicePath, Version: "v1.4.0", Replace: &debug.Module{Path: "../sluice"}}}}, "v1.4.0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, sluiceOf(&tt.bi))
		})
	}
}
