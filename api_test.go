package outbox_test

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var updateAPI = flag.Bool("update-api", false, "rewrite api.txt from the code")

// TestAPI freezes the public API: api.txt lists every exported name of the
// module's public packages (their functions and methods with signatures,
// types, constants, variables, struct fields and interface methods), and
// the test fails when the code and the list differ. A change to the API is
// then a visible change of api.txt in review; make it with
//
//	go test -run TestAPI -update-api .
//
// and say in CHANGELOG.md and docs/upgrading.md what a user changes.
func TestAPI(t *testing.T) {
	got := publicAPI(t, ".")
	if *updateAPI {
		require.NoError(t, os.WriteFile("api.txt", []byte(got), 0o600))
		return
	}
	want, err := os.ReadFile("api.txt")
	require.NoError(t, err)
	if string(want) == got {
		return
	}
	wantSet, gotSet := lines(string(want)), lines(got)
	var diff []string
	for l := range gotSet {
		if !wantSet[l] {
			diff = append(diff, "+ "+l)
		}
	}
	for l := range wantSet {
		if !gotSet[l] {
			diff = append(diff, "- "+l)
		}
	}
	sort.Strings(diff)
	t.Fatalf("the public API differs from api.txt (+ in the code only, - in api.txt only):\n%s\n"+
		"if the change is meant, run go test -run TestAPI -update-api . and record it in CHANGELOG.md and docs/upgrading.md",
		strings.Join(diff, "\n"))
}

func lines(s string) map[string]bool {
	set := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		set[l] = true
	}
	return set
}

// publicAPI lists the exported names of the packages under root that a
// user imports: not internal/, examples/, integration/, cmd/, testdata/,
// or the adapter modules, which have go.mod files of their own.
func publicAPI(t *testing.T, root string) string {
	t.Helper()
	fset := token.NewFileSet()
	var out []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == root {
				return nil
			}
			switch d.Name() {
			case "internal", "examples", "integration", "cmd", "testdata", "docs", "migrations":
				return filepath.SkipDir
			}
			if strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(filepath.Dir(path))
		if pkg == "." {
			pkg = "outbox"
		}
		out = append(out, fileAPI(fset, pkg, f)...)
		return nil
	})
	require.NoError(t, err)
	sort.Strings(out)
	return strings.Join(out, "\n") + "\n"
}

// fileAPI lists the exported names one file declares, as "package: decl".
func fileAPI(fset *token.FileSet, pkg string, f *ast.File) []string {
	text := func(n ast.Node) string {
		var b bytes.Buffer
		_ = printer.Fprint(&b, fset, n)
		return strings.Join(strings.Fields(b.String()), " ")
	}
	var out []string
	add := func(format string, args ...any) { out = append(out, pkg+": "+fmt.Sprintf(format, args...)) }
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv == nil {
				add("func %s%s", d.Name.Name, strings.TrimPrefix(text(d.Type), "func"))
				continue
			}
			recv := d.Recv.List[0].Type
			base := recv
			if s, ok := base.(*ast.StarExpr); ok {
				base = s.X
			}
			if id, ok := base.(*ast.Ident); ok && !id.IsExported() {
				continue
			}
			add("method (%s) %s%s", text(recv), d.Name.Name, strings.TrimPrefix(text(d.Type), "func"))
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					switch ty := s.Type.(type) {
					case *ast.StructType:
						add("type %s struct", s.Name.Name)
						for _, field := range ty.Fields.List {
							for _, n := range field.Names {
								if n.IsExported() {
									add("field %s.%s %s", s.Name.Name, n.Name, text(field.Type))
								}
							}
							if len(field.Names) == 0 {
								add("embedded %s.%s", s.Name.Name, text(field.Type))
							}
						}
					case *ast.InterfaceType:
						add("type %s interface", s.Name.Name)
						for _, m := range ty.Methods.List {
							for _, n := range m.Names {
								add("interface method %s.%s%s", s.Name.Name, n.Name, strings.TrimPrefix(text(m.Type), "func"))
							}
							if len(m.Names) == 0 {
								add("embedded %s.%s", s.Name.Name, text(m.Type))
							}
						}
					default:
						add("type %s %s", s.Name.Name, text(s.Type))
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() {
							add("%s %s", d.Tok, n.Name)
						}
					}
				}
			}
		}
	}
	return out
}
