package lua

import (
	"embed"
	"strings"
	"testing"
)

//go:embed *.lua
var files embed.FS

// TestScriptFiles keeps the scripts readable: no file of lua/ is longer
// than maxLines, and admit.lua is whole once its parts are put in (no
// "-- @include" is left, and every part it is made of is in it).
func TestScriptFiles(t *testing.T) {
	const maxLines = 600
	entries, err := files.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := files.ReadFile(e.Name())
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), "\n"); n > maxLines {
			t.Errorf("lua/%s has %d lines, more than %d: split it (docs/architecture.md says how the parts are put together)", e.Name(), n, maxLines)
		}
	}
	admit := admitScript()
	if i := strings.Index(admit, "-- @include"); i >= 0 {
		t.Errorf("admit.lua still has an -- @include line: %q", admit[i:i+40])
	}
	for _, part := range []string{"window", "quota", "concurrency", "phases", "twostep", "roomops", "quick", "release_slot"} {
		if !strings.Contains(admit, "-- @begin "+part) {
			t.Errorf("admit.lua lacks its part %q", part)
		}
	}
}
