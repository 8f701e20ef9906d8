package logstyle_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/constant"
	"go/importer"
	"go/parser"
	"go/printer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// maxMessage is the longest message allowed: what a line says more
// belongs in its attributes, or in the operations guide's table of
// messages.
const maxMessage = 60

// messageArg is where log/slog's functions and *slog.Logger's methods take
// their message.
var messageArg = map[string]int{
	"Debug": 0, "Info": 0, "Warn": 0, "Error": 0,
	"DebugContext": 1, "InfoContext": 1, "WarnContext": 1, "ErrorContext": 1,
	"Log": 2, "LogAttrs": 2,
}

// TestLogMessagesAreConstant type-checks every package of the module, and
// of the benchmark module, without their tests, and requires the message
// of every call to log/slog (the package's functions and a Logger's
// methods) to be a constant, a string literal or a const, never a value
// built at run time, and short. A helper that passes a message on takes
// it as a logMsg, a string type that only a constant converts to
// implicitly; an explicit conversion to it must be of a constant.
func TestLogMessagesAreConstant(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	var found []string
	calls := 0
	for _, dir := range []string{root, filepath.Join(root, "bench")} {
		n, bad := check(t, dir)
		calls += n
		found = append(found, bad...)
	}
	require.Greater(t, calls, 20, "log calls checked")
	require.Empty(t, found, "log messages built at run time: give each a constant message and put what varies in attributes (\"err\", err)")
}

// TestCheckCatchesBuiltMessages runs the check on a small module of its
// own, whose log calls build their messages the ways that are refused.
func TestCheckCatchesBuiltMessages(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/m\n\ngo 1.22\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "m.go"), []byte(`package m

import (
	"context"
	"errors"
	"log/slog"
)

const started = "job started"

type worker struct{ log *slog.Logger }

func (w *worker) run(ctx context.Context, err error, what string) {
	w.log.Info(started, "job", 1)
	w.log.Warn("job failed", "err", err)
	slog.Info("job " + "done")
	w.log.Error("job failed: " + err.Error())
	slog.Warn(what)
	w.log.InfoContext(ctx, "step "+what)
	w.log.Log(ctx, slog.LevelInfo, errors.New("x").Error())
	slog.Debug("a message that says everything it could say in a long sentence")
	w.warn("job deferred", "err", err)
	w.warn(logMsg("job " + what))
}

type logMsg string

func (w *worker) warn(msg logMsg, args ...any) { w.log.Warn(string(msg), args...) }
`), 0o644))
	n, bad := check(t, dir)
	require.Equal(t, 9, n)
	require.Len(t, bad, 6, "%q", bad)
	for i, want := range []string{`m.go:17: w.log.Error("job failed: " + err.Error())`, `m.go:18: slog.Warn(what)`, `m.go:19: w.log.InfoContext(ctx, "step "+what)`, `m.go:20: w.log.Log(ctx, slog.LevelInfo, errors.New("x").Error())`, "longer than 60 bytes", `m.go:23: logMsg("job " + what)`} {
		require.True(t, strings.HasSuffix(bad[i], want), "%s, want …%s", bad[i], want)
	}
}

// pkg is one package of `go list -json`.
type pkg struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Export     string
	Standard   bool
	Module     *struct{ Path, Dir string }
}

// check type-checks the packages of the module in dir and returns how
// many log calls it found and the ones whose message is not a constant.
func check(t *testing.T, dir string) (int, []string) {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-export", "-json=ImportPath,Dir,GoFiles,Export,Standard,Module", "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list in %s: %s", dir, stderr.String())
	exports := map[string]string{}
	var own []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else {
			require.NoError(t, err)
		}
		exports[p.ImportPath] = p.Export
		if !p.Standard && p.Module != nil && p.Module.Dir == dir {
			own = append(own, p)
		}
	}
	require.NotEmpty(t, own, "packages of the module in %s", dir)

	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		if f := exports[path]; f != "" {
			return os.Open(f)
		}
		return nil, fmt.Errorf("no export data for %s", path)
	})
	calls := 0
	var bad []string
	for _, p := range own {
		var files []*ast.File
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, 0)
			require.NoError(t, err)
			files = append(files, f)
		}
		info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}, Uses: map[*ast.Ident]types.Object{}}
		_, err := (&types.Config{Importer: imp}).Check(p.ImportPath, fset, files, info)
		require.NoError(t, err, "type-check %s", p.ImportPath)
		for _, f := range files {
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				pos := fset.Position(call.Pos())
				rel, _ := filepath.Rel(dir, pos.Filename)
				if isLogMsg(info, call.Fun) && len(call.Args) == 1 && info.Types[call.Args[0]].Value == nil && !isLogMsg(info, call.Args[0]) {
					bad = append(bad, fmt.Sprintf("%s:%d: %s", rel, pos.Line, source(fset, call)))
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				fn, ok := info.Uses[sel.Sel].(*types.Func)
				if !ok || fn.Pkg() == nil || fn.Pkg().Path() != "log/slog" {
					return true
				}
				i, ok := messageArg[fn.Name()]
				if !ok || i >= len(call.Args) {
					return true
				}
				calls++
				msg := call.Args[i]
				if c, ok := msg.(*ast.CallExpr); ok && info.Types[c.Fun].IsType() && len(c.Args) == 1 && isLogMsg(info, c.Args[0]) {
					return true // string(msg), msg a logMsg
				}
				switch v := info.Types[msg].Value; {
				case v == nil:
					bad = append(bad, fmt.Sprintf("%s:%d: %s", rel, pos.Line, source(fset, call)))
				case v.Kind() == constant.String && len(constant.StringVal(v)) > maxMessage:
					bad = append(bad, fmt.Sprintf("%s:%d: %s: longer than %d bytes", rel, pos.Line, v, maxMessage))
				}
				return true
			})
		}
	}
	return calls, bad
}

// isLogMsg reports whether e's type (or e, a type) is named logMsg: the
// type a package gives the messages its log helpers pass on, to which
// only a constant converts implicitly.
func isLogMsg(info *types.Info, e ast.Expr) bool {
	n, ok := info.Types[e].Type.(*types.Named)
	return ok && n.Obj().Name() == "logMsg"
}

// source prints an expression as it is written.
func source(fset *token.FileSet, e ast.Expr) string {
	var b strings.Builder
	if err := printer.Fprint(&b, fset, e); err != nil {
		return fmt.Sprintf("%T", e)
	}
	return b.String()
}
