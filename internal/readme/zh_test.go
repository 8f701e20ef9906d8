package readme_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// README.zh-CN.md is README.md in Chinese. Its prose is translated, but its
// fenced blocks (the sh blocks TestREADME runs, the Go code copied from the
// Examples, the YAML, the diagram and the output shown), its images and
// its links are README.md's own, in the same order. Whoever changes a
// block, an image or a link in one file changes it in the other in the
// same commit, and translates the prose around it; this test fails until
// both agree.

// linkRE matches a link or an image, [text](target) or ![alt](target), and
// captures its target.
var linkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestZhCNCarriesREADMEBlocks requires README.zh-CN.md to have README.md's
// fenced blocks, images and links, the same and in the same order, and
// each file to link to the other.
func TestZhCNCarriesREADMEBlocks(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	if d := zhDifference(t, filepath.Join(root, "README.md"), filepath.Join(root, "README.zh-CN.md")); d != "" {
		t.Fatal(d)
	}
}

// TestZhCNCheckCatchesOneSidedChanges changes copies of the two READMEs
// the ways a hurried edit does, one file only, and requires the check to
// notice each.
func TestZhCNCheckCatchesOneSidedChanges(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	en := readFile(t, filepath.Join(root, "README.md"))
	zh := readFile(t, filepath.Join(root, "README.zh-CN.md"))
	blocks := readBlocks(t, filepath.Join(root, "README.md"))
	first := func(info string) block {
		i := slices.IndexFunc(blocks, func(b block) bool { return b.info == info })
		require.NotEqual(t, -1, i, "README.md has a ```%s block", info)
		return blocks[i]
	}

	for _, c := range []struct {
		name    string
		en, zh  func(string) string
		problem string // in what zhDifference says
	}{
		{name: "unchanged"},
		{name: "a command in the Chinese README", zh: editBlockLine(t, first("sh"), " --verbose"), problem: "its line 1"},
		{name: "a command in README.md", en: editBlockLine(t, first("sh"), " --verbose"), problem: "its line 1"},
		{name: "Go code in README.md", en: editBlockLine(t, first("go"), " // changed"), problem: "its line 1"},
		{name: "a block's language", zh: retagBlock(t, first("go"), "golang"), problem: "```golang"},
		{name: "a block left out", zh: moveBlockToEnd(t, first("yaml"), false), problem: "fenced blocks"},
		{name: "a block moved", zh: moveBlockToEnd(t, first("sh"), true), problem: "fenced blocks"},
		{name: "an image", zh: func(s string) string { return strings.Replace(s, "docs/img/dashboard.png", "docs/img/other.png", 1) }, problem: "images and links"},
		{name: "a link", en: func(s string) string { return strings.Replace(s, "(docs/architecture.md)", "(docs/design.md)", 1) }, problem: "images and links"},
		{name: "the link back", zh: func(s string) string { return strings.ReplaceAll(s, "(README.md)", "(README.en.md)") }, problem: "link back"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			e, z := en, zh
			if c.en != nil {
				e = c.en(e)
				require.NotEqual(t, en, e, "the change applies to README.md")
			}
			if c.zh != nil {
				z = c.zh(z)
				require.NotEqual(t, zh, z, "the change applies to README.zh-CN.md")
			}
			enPath, zhPath := filepath.Join(dir, "README.md"), filepath.Join(dir, "README.zh-CN.md")
			require.NoError(t, os.WriteFile(enPath, []byte(e), 0o644))
			require.NoError(t, os.WriteFile(zhPath, []byte(z), 0o644))

			d := zhDifference(t, enPath, zhPath)
			if c.problem == "" {
				require.Empty(t, d)
				return
			}
			require.Contains(t, d, c.problem)
		})
	}
}

// zhDifference says how the Chinese README at zhPath fails to carry
// README.md's (at enPath) fenced blocks, images and links, the same and in
// order, or fails to link to it; "" when it carries them.
func zhDifference(t *testing.T, enPath, zhPath string) string {
	t.Helper()
	if d := firstBlockDifference(readBlocks(t, enPath), readBlocks(t, zhPath)); d != "" {
		return "README.zh-CN.md must carry README.md's fenced blocks unchanged, in order (change both files together): " + d
	}
	enText, zhText := readFile(t, enPath), readFile(t, zhPath)
	if !strings.Contains(enText, "(README.zh-CN.md)") {
		return "README.md must link to README.zh-CN.md"
	}
	if !strings.Contains(zhText, "(README.md)") {
		return "README.zh-CN.md must link back to README.md, its source"
	}
	if e, z := targets(enText, "README.zh-CN.md"), targets(zhText, "README.md"); !slices.Equal(e, z) {
		return fmt.Sprintf("README.zh-CN.md must have README.md's images and links, in order: README.md's are %q, README.zh-CN.md's %q", e, z)
	}
	return ""
}

// firstBlockDifference names the first fenced block in which en and zh
// differ (its number, where it starts in each file, and the first line
// that differs), or returns "" when they agree.
func firstBlockDifference(en, zh []block) string {
	for i := 0; i < max(len(en), len(zh)); i++ {
		switch {
		case i >= len(zh):
			return fmt.Sprintf("block %d (README.md line %d, ```%s) is missing from README.zh-CN.md, which has %d blocks", i+1, en[i].line, en[i].info, len(zh))
		case i >= len(en):
			return fmt.Sprintf("block %d (README.zh-CN.md line %d, ```%s) is not in README.md, which has %d blocks", i+1, zh[i].line, zh[i].info, len(en))
		}
		e, z := en[i], zh[i]
		where := fmt.Sprintf("block %d (README.md line %d, README.zh-CN.md line %d)", i+1, e.line, z.line)
		if e.info != z.info {
			return fmt.Sprintf("%s: README.md's is ```%s, README.zh-CN.md's ```%s", where, e.info, z.info)
		}
		for k := 0; k < max(len(e.text), len(z.text)); k++ {
			var el, zl string
			if k < len(e.text) {
				el = e.text[k]
			}
			if k < len(z.text) {
				zl = z.text[k]
			}
			if k >= len(e.text) || k >= len(z.text) || el != zl {
				return fmt.Sprintf("%s, its line %d: README.md has %q, README.zh-CN.md %q (README.md's block has %d lines, README.zh-CN.md's %d)",
					where, k+1, el, zl, len(e.text), len(z.text))
			}
		}
	}
	return ""
}

// targets are the targets of text's images and links, in order, but for
// the link to the other README, other.
func targets(text, other string) []string {
	var out []string
	for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
		if m[1] != other {
			out = append(out, m[1])
		}
	}
	return out
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// The edits below find the block b of README.md in either file by its
// first line, so they apply to the Chinese README as well.

// editBlockLine appends suffix to the first line of the block b.
func editBlockLine(t *testing.T, b block, suffix string) func(string) string {
	t.Helper()
	require.NotEmpty(t, b.text, "the block at README.md line %d", b.line)
	return func(s string) string {
		fence := "```" + b.info + "\n" + b.text[0] + "\n"
		return strings.Replace(s, fence, "```"+b.info+"\n"+b.text[0]+suffix+"\n", 1)
	}
}

// retagBlock gives the block b the language info instead of its own.
func retagBlock(t *testing.T, b block, info string) func(string) string {
	t.Helper()
	require.NotEmpty(t, b.text, "the block at README.md line %d", b.line)
	return func(s string) string {
		return strings.Replace(s, "```"+b.info+"\n"+b.text[0]+"\n", "```"+info+"\n"+b.text[0]+"\n", 1)
	}
}

// moveBlockToEnd takes the block b out of its place and, when keep is
// set, puts it back at the end of the file.
func moveBlockToEnd(t *testing.T, b block, keep bool) func(string) string {
	t.Helper()
	whole := "```" + b.info + "\n" + strings.Join(b.text, "\n") + "\n```\n"
	return func(s string) string {
		if !strings.Contains(s, whole) {
			return s
		}
		s = strings.Replace(s, whole, "", 1)
		if keep {
			s += "\n" + whole
		}
		return s
	}
}
