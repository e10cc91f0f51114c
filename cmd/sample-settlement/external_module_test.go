package main

import (
	"bytes"
	"encoding/json"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// sdkModule is the SDK's module path, which the sample imports as any user's code does.
const sdkModule = "github.com/stepwise-go/stepwise"

// TestBuildsAsExternalModule builds the sample the way a team that copies it out of this
// repository would: its non-test source in a module of its own that requires the SDK
// (replaced by this checkout), offline, with this repository's go.sum. A sample that imports
// one of the SDK's internal packages cannot leave the repository; the test lists every such
// import it finds.
func TestBuildsAsExternalModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the sample in a module of its own; skipped with -short")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := moduleGoVersion(t, filepath.Join(root, "go.mod"))

	dir := t.TempDir()
	internal := map[string][]string{} // import path -> files importing it
	fset := token.NewFileSet()
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(path, "_test.go") {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.HasSuffix(path, ".go") {
			f, err := parser.ParseFile(fset, path, data, parser.ImportsOnly)
			if err != nil {
				return err
			}
			for _, imp := range f.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if strings.HasPrefix(p, sdkModule+"/internal/") || p == sdkModule+"/internal" {
					internal[p] = append(internal[p], path)
				}
			}
		}
		dst := filepath.Join(dir, path)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		return os.WriteFile(dst, data, 0o644)
	})
	if err != nil {
		t.Fatalf("copying the sample: %v", err)
	}

	if len(internal) > 0 {
		var lines []string
		for p, files := range internal {
			lines = append(lines, p+" (imported by "+strings.Join(files, ", ")+")")
		}
		sort.Strings(lines)
		list := strings.Join(lines, "\n\t")
		t.Fatalf("the sample imports SDK-internal packages, so it cannot build outside this module:\n\t%s\n"+
			"use the public API instead (or make what it needs public)", list)
	}

	// The module's requirements are the SDK and every module the SDK's go.mod requires, as
	// "go mod tidy" would write them for a team's service, so that the build resolves what it
	// imports from the module cache alone (-mod=readonly). With -mod=mod and only the SDK
	// required, go had to load the whole module graph, down to go.mod files of versions that
	// nothing builds (go-logr/logr v1.2.2, required by a go1.16 module): on a machine whose
	// cache held only what the repository's own build needs, the test failed offline.
	gomod := "module example.com/settlement\n\ngo " + goVersion + "\n\n" +
		"require " + sdkModule + " v0.0.0\n\n" +
		"require (\n" + strings.Join(moduleRequirements(t, filepath.Join(root, "go.mod")), "\n") + "\n)\n\n" +
		"replace " + sdkModule + " => " + filepath.ToSlash(root) + "\n"
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
		t.Fatal(err)
	}

	for _, args := range [][]string{{"build", "./..."}, {"vet", "./..."}} {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOPROXY=off", "GOWORK=off", "GOTOOLCHAIN=local")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("go %s in a module outside the repository: %v\n%s", strings.Join(args, " "), err, out.String())
		}
	}
}

var goDirective = regexp.MustCompile(`(?m)^go (\S+)$`)

// moduleGoVersion is the go directive of the go.mod at path.
func moduleGoVersion(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := goDirective.FindSubmatch(data)
	if m == nil {
		t.Fatalf("%s has no go directive", path)
	}
	return string(m[1])
}

// moduleRequirements is every "path version" the go.mod at path requires, as go mod edit
// reads it.
func moduleRequirements(t *testing.T, path string) []string {
	t.Helper()
	out, err := exec.Command("go", "mod", "edit", "-json", path).Output()
	if err != nil {
		t.Fatalf("go mod edit -json %s: %v", path, err)
	}
	var mod struct {
		Require []struct{ Path, Version string }
	}
	if err := json.Unmarshal(out, &mod); err != nil {
		t.Fatalf("reading go mod edit -json %s: %v", path, err)
	}
	if len(mod.Require) == 0 {
		t.Fatalf("%s requires nothing; cannot build the sample outside the repository", path)
	}
	reqs := make([]string, len(mod.Require))
	for i, r := range mod.Require {
		reqs[i] = "\t" + r.Path + " " + r.Version
	}
	return reqs
}
