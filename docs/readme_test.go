package docs_test

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeFirstScreen: a newcomer's first screen of the README gives exactly the two
// commands that show Stepwise working — the sample end to end and the tests — and nothing
// they would have to set up first. Longer wiring belongs further down.
func TestReadmeFirstScreen(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	lines := strings.Split(string(b), "\n")
	const screen = 24 // lines of a terminal, or of a repository page above the fold
	start := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "```") {
			start = i
			break
		}
	}
	if start < 0 || start >= screen {
		t.Fatalf("README.md: the first code block starts at line %d; it must be on the first screen (line < %d)", start+1, screen)
	}
	var cmds []string
	for _, l := range lines[start+1:] {
		if strings.HasPrefix(l, "```") {
			break
		}
		if cmd, _, _ := strings.Cut(l, "#"); strings.TrimSpace(cmd) != "" {
			cmds = append(cmds, strings.TrimSpace(cmd))
		}
	}
	want := []string{"go run ./cmd/sample-settlement demo", "go test ./..."}
	if strings.Join(cmds, "\n") != strings.Join(want, "\n") {
		t.Errorf("README.md: the first code block has commands %q; want exactly %q", cmds, want)
	}
}
