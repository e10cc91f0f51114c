package main

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The service knows its bank only as settlement.Bank: the settlement package imports neither
// the fake bank nor its adapter, and of this command's files only the demo (which starts a
// fake bank in its own process) and bank.go (the one place that names the adapter) do.
// Guards against: the fake bank's types creeping back into the service a team copies, so that
// swapping in a real provider's adapter means editing the service.
func TestServiceKnowsTheBankOnlyAsAnInterface(t *testing.T) {
	t.Parallel()
	fake := []string{sdkModule + "/workflowtest/fakebank", sdkModule + "/cmd/sample-settlement/bankfake"}
	allowed := map[string]bool{"cmd_demo.go": true, "bank.go": true}
	for _, dir := range []string{".", "settlement"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") || (dir == "." && allowed[filepath.Base(path)]) {
				continue
			}
			src, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, src, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				for _, bad := range fake {
					if p == bad {
						t.Errorf("%s imports %s: the service must know its bank only as settlement.Bank (choose the adapter in bank.go)", path, p)
					}
				}
			}
		}
	}
}
