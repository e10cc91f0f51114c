package docs_test

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

var updateAPI = flag.Bool("update-api", false, "rewrite docs/api.txt from the code")

// The public API is kept in docs/api.txt, a declaration per line: a change to what users can
// call, or to a signature or an exported field, shows in review as a change to that file. It
// covers every package of the SDK a user imports (not internal/, cmd/, nor the test helpers
// under workflowtest/, which have their own stability promise), and lists the exported
// functions and methods with their signatures, the exported types with their exported fields
// and interface methods, the exported constants and variables, and the exported methods of
// the internal types a public alias makes reachable. Its header counts the names (functions,
// methods, types, constants, variables): the surface the project measures itself by; fields
// and interface methods are listed but not counted.
//
// After changing the API on purpose: go test ./docs -run TestPublicAPI -update-api
func TestPublicAPI(t *testing.T) {
	got := publicAPI(t)
	if *updateAPI {
		if err := os.WriteFile("api.txt", []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("api.txt")
	if err != nil {
		t.Fatalf("docs/api.txt: %v; write it with: go test ./docs -run TestPublicAPI -update-api", err)
	}
	if string(want) != got {
		t.Errorf("the public API differs from docs/api.txt; if the change is meant, run\n\tgo test ./docs -run TestPublicAPI -update-api\nand review the diff (it is the API change users will see):\n%s",
			lineDiff(string(want), got))
	}
}

// publicAPI renders the API as docs/api.txt holds it: a header of counts per package, then
// every name, sorted.
func publicAPI(t *testing.T) string {
	t.Helper()
	names := map[string][]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			switch {
			case rel == ".":
			case strings.HasPrefix(d.Name(), "."), strings.HasPrefix(d.Name(), "_"), d.Name() == "testdata",
				d.Name() == "internal", d.Name() == "vendor", rel == "cmd", rel == "workflowtest", rel == "docs":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		pkg := path.Dir(rel)
		if pkg == "." {
			pkg = "stepwise"
		}
		names[pkg] = append(names[pkg], fileAPI(t, p)...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	counted := func(ns []string) int {
		n := 0
		for _, e := range ns {
			if !strings.HasPrefix(e, "field ") && !strings.HasPrefix(e, "imethod ") {
				n++
			}
		}
		return n
	}
	pkgs := make([]string, 0, len(names))
	total := 0
	for pkg, ns := range names {
		if len(ns) == 0 {
			continue
		}
		pkgs = append(pkgs, pkg)
		total += counted(ns)
	}
	sort.Strings(pkgs)
	var b strings.Builder
	fmt.Fprintf(&b, "# Exported names of the SDK's importable packages (not internal/, cmd/, workflowtest/): %d in all.\n", total)
	fmt.Fprintf(&b, "# Counted: functions, methods (with those of aliased internal types), types, constants, variables.\n")
	for _, pkg := range pkgs {
		fmt.Fprintf(&b, "# %-16s %d\n", pkg, counted(names[pkg]))
	}
	for _, pkg := range pkgs {
		ns := names[pkg]
		sort.Strings(ns)
		for _, n := range ns {
			fmt.Fprintf(&b, "%s %s\n", pkg, n)
		}
	}
	return b.String()
}

// fileAPI lists the exported declarations of one file, with their signatures.
func fileAPI(t *testing.T, file string) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	src := func(n ast.Node) string {
		var b strings.Builder
		if err := printer.Fprint(&b, fset, n); err != nil {
			t.Fatal(err)
		}
		return strings.Join(strings.Fields(b.String()), " ")
	}
	sig := func(ft *ast.FuncType) string { return strings.TrimPrefix(src(ft), "func") }
	typeParams := func(fl *ast.FieldList) string {
		if fl == nil {
			return ""
		}
		var ps []string
		for _, p := range fl.List {
			var ns []string
			for _, n := range p.Names {
				ns = append(ns, n.Name)
			}
			ps = append(ps, strings.Join(ns, ", ")+" "+src(p.Type))
		}
		return "[" + strings.Join(ps, ", ") + "]"
	}
	var out []string
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv == nil {
				out = append(out, "func "+d.Name.Name+typeParams(d.Type.TypeParams)+sig(&ast.FuncType{Params: d.Type.Params, Results: d.Type.Results}))
				continue
			}
			if recv := recvName(d.Recv.List[0].Type); ast.IsExported(recv) {
				out = append(out, "method "+recv+"."+d.Name.Name+sig(d.Type))
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					name := s.Name.Name
					tparams := typeParams(s.TypeParams)
					switch ty := s.Type.(type) {
					case *ast.StructType:
						out = append(out, "type "+name+tparams+" struct")
						for _, fl := range ty.Fields.List {
							if len(fl.Names) == 0 { // embedded
								if n := recvName(fl.Type); ast.IsExported(n) {
									out = append(out, "field "+name+"."+n+" (embedded) "+src(fl.Type))
								}
							}
							for _, n := range fl.Names {
								if n.IsExported() {
									out = append(out, "field "+name+"."+n.Name+" "+src(fl.Type))
								}
							}
						}
					case *ast.InterfaceType:
						out = append(out, "type "+name+tparams+" interface")
						for _, m := range ty.Methods.List {
							for _, n := range m.Names {
								if ft, ok := m.Type.(*ast.FuncType); ok && n.IsExported() {
									out = append(out, "imethod "+name+"."+n.Name+sig(ft))
								}
							}
							if len(m.Names) == 0 {
								out = append(out, "imethod "+name+" (embedded) "+src(m.Type))
							}
						}
					default:
						if s.Assign.IsValid() {
							out = append(out, "type "+name+tparams+" = "+src(s.Type))
							for _, m := range aliasedMethods(t, f, s) {
								out = append(out, "method "+name+"."+m+" (alias)")
							}
						} else {
							out = append(out, "type "+name+tparams+" "+src(s.Type))
						}
					}
				case *ast.ValueSpec:
					kind := "var"
					if d.Tok == token.CONST {
						kind = "const"
					}
					for _, n := range s.Names {
						if n.IsExported() {
							out = append(out, kind+" "+n.Name)
						}
					}
				}
			}
		}
	}
	return out
}

func recvName(x ast.Expr) string {
	switch x := x.(type) {
	case *ast.StarExpr:
		return recvName(x.X)
	case *ast.IndexExpr:
		return recvName(x.X)
	case *ast.IndexListExpr:
		return recvName(x.X)
	case *ast.Ident:
		return x.Name
	}
	return ""
}

// aliasedMethods are the exported methods of the internal type the alias s names, which the
// alias makes callable by users.
func aliasedMethods(t *testing.T, f *ast.File, s *ast.TypeSpec) []string {
	t.Helper()
	sel, ok := s.Type.(*ast.SelectorExpr)
	if !ok {
		return nil
	}
	x, ok := sel.X.(*ast.Ident)
	if !ok {
		return nil
	}
	for _, im := range f.Imports {
		p := strings.Trim(im.Path.Value, `"`)
		i := strings.Index(p, "/internal/")
		if i < 0 || path.Base(p) != x.Name {
			continue
		}
		dir := filepath.Join(root, filepath.FromSlash(p[i+1:]))
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
				continue
			}
			df, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, e.Name()), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range df.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv != nil && fd.Name.IsExported() && recvName(fd.Recv.List[0].Type) == sel.Sel.Name {
					out = append(out, fd.Name.Name)
				}
			}
		}
		return out
	}
	return nil
}

// lineDiff lists the lines only in want (-) and only in got (+).
func lineDiff(want, got string) string {
	w, g := map[string]bool{}, map[string]bool{}
	for _, l := range strings.Split(want, "\n") {
		w[l] = true
	}
	for _, l := range strings.Split(got, "\n") {
		g[l] = true
	}
	var b strings.Builder
	for _, l := range strings.Split(want, "\n") {
		if !g[l] {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range strings.Split(got, "\n") {
		if !w[l] {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}
