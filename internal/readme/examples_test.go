package readme_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The Go code the README and the guides in docs/ show is copied from
// Example functions, which go test runs and checks: a ```go block names
// the Example it comes from in the prose before it ("from
// `queue.ExampleClient_Enqueue`"), and its lines are that Example's lines,
// in the same order, some left out (set-up, checks) and none changed. The
// Example's output, after its "// Output:" line, may be shown as comments.

// exampleRefRE finds where a block says it comes from in prose: from
// `queue.ExampleKey`.
var exampleRefRE = regexp.MustCompile("from `(\\w+)\\.(Example\\w*)`")

// TestGoBlocksFollowExamples requires every ```go block of README.md, and
// every one of docs/*.md that names an Example, to be an excerpt of that
// Example.
func TestGoBlocksFollowExamples(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	checked := 0
	for _, path := range append([]string{filepath.Join(root, "README.md")}, docs...) {
		rel, _ := filepath.Rel(root, path)
		for _, gb := range goBlocks(t, path) {
			if gb.ref == nil {
				require.NotEqual(t, "README.md", rel, "README.md line %d: a Go block names the Example it is copied from in the prose before it (from `pkg.ExampleX`)", gb.line)
				continue
			}
			body, err := exampleBody(root, gb.ref[1], gb.ref[2])
			require.NoError(t, err, "%s line %d", rel, gb.line)
			if d := excerptDifference(gb.text, body); d != "" {
				t.Errorf("%s line %d: the block is not an excerpt of %s.%s: %s (copy the lines from the Example, or change the Example and copy them)", rel, gb.line, gb.ref[1], gb.ref[2], d)
			}
			checked++
		}
	}
	require.GreaterOrEqual(t, checked, 3, "Go blocks checked against their Examples")
}

// TestExcerptCheckCatchesChanges: a changed, added or reordered line is
// caught; lines left out are not.
func TestExcerptCheckCatchesChanges(t *testing.T) {
	t.Parallel()
	// as exampleBody returns it: without the "// Output:" line
	body := []string{"a := 1", "", "b := 2", "fmt.Println(a + b)", "// 3"}
	for _, c := range []struct {
		block []string
		ok    bool
	}{
		{[]string{"a := 1", "fmt.Println(a + b)", "// 3"}, true},
		{[]string{"a := 1", "", "b := 2"}, true},
		{[]string{"a := 2"}, false},
		{[]string{"b := 2", "a := 1"}, false},
		{[]string{"a := 1", "c := 3"}, false},
		{[]string{"// Output:"}, false},
	} {
		d := excerptDifference(c.block, body)
		require.Equal(t, c.ok, d == "", "%q: %s", c.block, d)
	}
}

// goBlock is a ```go block and the Example named before it, if any.
type goBlock struct {
	line int
	text []string
	ref  []string // exampleRefRE's match, or nil
}

func goBlocks(t *testing.T, path string) []goBlock {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var (
		out     []goBlock
		cur     *goBlock
		prose   []string // since the last block
		inOther bool
	)
	for i, l := range strings.Split(string(b), "\n") {
		switch {
		case cur != nil:
			if strings.HasPrefix(l, "```") {
				out = append(out, *cur)
				cur, prose = nil, nil
				continue
			}
			cur.text = append(cur.text, l)
		case inOther:
			if strings.HasPrefix(l, "```") {
				inOther, prose = false, nil
			}
		case l == "```go":
			cur = &goBlock{line: i + 1}
			if m := exampleRefRE.FindAllStringSubmatch(strings.Join(strings.Fields(strings.Join(prose, " ")), " "), -1); m != nil {
				cur.ref = m[len(m)-1]
			}
		case strings.HasPrefix(l, "```"):
			inOther = true
		default:
			prose = append(prose, l)
		}
	}
	return out
}

// exampleBody returns the lines of the body of the Example named fn in
// package directory pkg, one tab of indentation removed, without its
// "// Output:" line.
func exampleBody(root, pkg, fn string) ([]string, error) {
	dir := filepath.Join(root, pkg)
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no test files in %s/ for %s.%s", pkg, pkg, fn)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		file, err := parser.ParseFile(fset, f, src, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		for _, d := range file.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Name.Name != fn || fd.Recv != nil {
				continue
			}
			from, to := fset.Position(fd.Body.Lbrace).Offset+1, fset.Position(fd.Body.Rbrace).Offset
			var lines []string
			for _, l := range strings.Split(strings.Trim(string(src[from:to]), "\n"), "\n") {
				if strings.TrimSpace(l) == "// Output:" || strings.TrimSpace(l) == "// Unordered output:" {
					continue
				}
				lines = append(lines, strings.TrimPrefix(l, "\t"))
			}
			return lines, nil
		}
	}
	return nil, fmt.Errorf("no function %s in %s/*_test.go", fn, pkg)
}

// excerptDifference returns "" when every line of block is a line of
// body, in body's order (blank lines of block may stand anywhere), and
// otherwise the first line that is not.
func excerptDifference(block, body []string) string {
	next := 0
	for _, l := range block {
		l = strings.TrimRight(l, " \t")
		if l == "" {
			continue
		}
		i := slices.IndexFunc(body[next:], func(b string) bool { return strings.TrimRight(b, " \t") == l })
		if i < 0 {
			if slices.ContainsFunc(body, func(b string) bool { return strings.TrimRight(b, " \t") == l }) {
				return fmt.Sprintf("line %q is out of the Example's order", l)
			}
			return fmt.Sprintf("line %q is not in the Example", l)
		}
		next += i + 1
	}
	return ""
}
