package docs_test

import (
	"os"
	"regexp"
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

// TestReadmeQuickStartIsTheExample: the README's quick start and workflow/example_test.go
// ("this quick start as a runnable example") tell the same wiring story. Every SDK call the
// README's quick start makes — stepwise.NewClient, stepwise.AddWorker, client.Start,
// client.RunStart, client.Stop, outbox.Enqueue… — must be made by the example too,
// which compiles and runs in `go test ./workflow/`; a README that drifts to an API that no
// longer exists, or to another wiring, fails here.
func TestReadmeQuickStartIsTheExample(t *testing.T) {
	block := readmeGoBlock(t, "## Quick start")
	ex, err := os.ReadFile("../workflow/example_test.go")
	if err != nil {
		t.Fatalf("workflow/example_test.go: %v", err)
	}
	calls := regexp.MustCompile(`\b(stepwise|client|workflow|engine|ob|rec|migrations|river|riverpgxv5|outbox|reconcile|schedule)\.([A-Z]\w*)\(`).FindAllStringSubmatch(block, -1)
	if len(calls) < 5 {
		t.Fatalf("README.md quick start: found only %d SDK calls; the pattern no longer matches the README", len(calls))
	}
	for _, c := range calls {
		name := c[2] + "("
		switch c[1] {
		case "client", "engine", "ob", "rec": // receivers: the example may name its variables otherwise
		default:
			name = c[1] + "." + name
		}
		if !strings.Contains(string(ex), name) {
			t.Errorf("README.md quick start calls %s, which workflow/example_test.go does not: the two must tell one wiring story", c[0])
		}
	}
}

// TestReadmeQuickStartCompiles: the README's quick start is, character for character, the
// code between the README markers of internal/quickstart/quickstart.go, which compiles and
// which TestQuickStartDrainsOnSIGTERM runs in a real process (SIGTERM mid-delivery: nothing
// cut, every lease released). A README edited without that file fails here.
func TestReadmeQuickStartCompiles(t *testing.T) {
	readmeBlockIsCode(t, "## Quick start", "../internal/quickstart/quickstart.go", "README")
}

// The README's wait example is the code between the README WAIT markers of
// internal/quickstart/wait.go, which compiles.
func TestReadmeWaitExampleCompiles(t *testing.T) {
	readmeBlockIsCode(t, "## Runs that wait", "../internal/quickstart/wait.go", "README WAIT")
}

// readmeBlockIsCode fails unless the first Go block of the README's section is, character
// for character, the code of file between its "// <marker> BEGIN" and "// <marker> END"
// lines.
func readmeBlockIsCode(t *testing.T, section, file, marker string) {
	t.Helper()
	block := readmeGoBlock(t, section)
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	code := string(src)
	begin, end := "// "+marker+" BEGIN\n", "// "+marker+" END"
	a, z := strings.Index(code, begin), strings.Index(code, end)
	if a < 0 || z < a {
		t.Fatalf("%s: no '%s' ... '%s' markers", file, strings.TrimSpace(begin), end)
	}
	want := strings.TrimRight(code[a+len(begin):z], "\n") + "\n"
	if block != want {
		t.Errorf("README.md's %q block differs from %s between its %s markers; copy one to the other.\nREADME:\n%s\n%s:\n%s", section, file, marker, block, file, want)
	}
}

// readmeGoBlock returns the first Go code block of the README's section (a heading line).
func readmeGoBlock(t *testing.T, section string) string {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	readme := string(b)
	i := strings.Index(readme, section)
	if i < 0 {
		t.Fatalf("README.md has no '%s' section", section)
	}
	block := readme[i:]
	start := strings.Index(block, "```go\n")
	if start < 0 {
		t.Fatalf("README.md: '%s' has no Go code block", section)
	}
	block = block[start+len("```go\n"):]
	return block[:strings.Index(block, "```")]
}
