package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// commandPrefixes start what the README shows as a command to paste.
var commandPrefixes = []string{"go run ./", "go test ./", "sample-settlement ", "stepwise "}

// readmeCommands returns the commands the README shows: the lines of its sh blocks and its
// inline code spans that start like a command.
func readmeCommands(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	text := string(b)
	var cmds []string
	isCmd := func(s string) bool {
		for _, p := range commandPrefixes {
			if strings.HasPrefix(s, p) {
				return true
			}
		}
		return false
	}
	for _, block := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(text, -1) {
		for _, l := range strings.Split(block[1], "\n") {
			if cmd, _, _ := strings.Cut(l, "#"); isCmd(strings.TrimSpace(cmd)) {
				cmds = append(cmds, strings.TrimSpace(cmd))
			}
		}
	}
	// Inline spans may wrap across a line break in the Markdown source.
	for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(regexp.MustCompile("(?s)```.*?```").ReplaceAllString(text, ""), -1) {
		if s := strings.Join(strings.Fields(m[1]), " "); isCmd(s) {
			cmds = append(cmds, s)
		}
	}
	return cmds
}

// TestReadmeCommandsAreRun: every command the README shows to paste is run, in the form the
// README gives, by CI (.ci/run holds it verbatim) or by a test that says so with a comment
// `// README: <the command>` above the code that runs it (placeholders such as <slot> filled
// in there). Guards against: a README command that nobody runs, which breaks unseen (the
// README's first command once failed on every new database while CI stayed green).
func TestReadmeCommandsAreRun(t *testing.T) {
	ci, err := os.ReadFile("../.ci/run")
	if err != nil {
		t.Fatalf(".ci/run: %v", err)
	}
	markers := map[string]bool{}
	err = filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != ".." {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, l := range strings.Split(string(src), "\n") {
			if _, cmd, ok := strings.Cut(l, "// README: "); ok {
				markers[strings.TrimSpace(cmd)] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cmds := readmeCommands(t)
	if len(cmds) < 3 {
		t.Fatalf("found only %d commands in README.md (%q); the extraction no longer matches the README", len(cmds), cmds)
	}
	for _, cmd := range cmds {
		if strings.Contains(string(ci), cmd) || markers[cmd] {
			continue
		}
		t.Errorf("README.md shows %q, but neither .ci/run runs it nor does a test carry `// README: %s`", cmd, cmd)
	}
}
