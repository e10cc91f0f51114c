// Package docs_test keeps the design document honest: the repository must stand on its own
// (no reference to a design kept elsewhere), every link into docs/design.md must land on a
// heading, and every test the fault-drill table names must exist. Without these checks the
// document rots silently the first time a test or a section is renamed.
package docs_test

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// root is the module root, one level up from this package.
const root = ".."

// readDesign returns docs/design.md, failing the test if it is missing.
func readDesign(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("design.md")
	if err != nil {
		t.Fatalf("docs/design.md: %v; the design must live in the repository", err)
	}
	return string(b)
}

// repoFiles calls fn for every text file of the repository (not .git, not fuzz corpora), with
// its path relative to the module root.
func repoFiles(t *testing.T, fn func(rel string, data []byte)) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); name == ".git" || name == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil || !info.Mode().IsRegular() || info.Size() > 1<<20 {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.IndexByte(data, 0) >= 0 {
			return nil // binary
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		fn(filepath.ToSlash(rel), data)
		return nil
	})
	if err != nil {
		t.Fatalf("walking the repository: %v", err)
	}
}

// TestNoDesignOutsideRepo: a module user cannot read a design document kept outside this
// repository, so nothing may send them there. The forbidden names are built at run time so
// that this file does not match itself.
func TestNoDesignOutsideRepo(t *testing.T) {
	readDesign(t)
	forbidden := []string{
		strings.ToUpper("design") + ".md", // the old top-level name; cite docs/design.md
		"../" + "shared",
		"steering " + "repo",
	}
	repoFiles(t, func(rel string, data []byte) {
		for i, line := range strings.Split(string(data), "\n") {
			for _, f := range forbidden {
				if strings.Contains(line, f) {
					t.Errorf("%s:%d mentions %q: cite docs/design.md (a section by name) instead", rel, i+1, f)
				}
			}
		}
	})
}

// anchor is the fragment GitHub gives a Markdown heading: lower case, punctuation dropped,
// spaces made hyphens.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ' || r == '-':
			b.WriteRune('-')
		case r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestDesignLinksLand: every link to a section of docs/design.md or of docs/performance-log.md
// (the runs behind design.md's performance budget), from any Markdown file of the repository or
// from the document itself, names a heading that exists.
func TestDesignLinksLand(t *testing.T) {
	readDesign(t)
	docs := map[string]map[string]bool{} // file name in docs/ -> its headings' anchors
	for _, name := range []string{"design.md", "performance-log.md"} {
		text, err := os.ReadFile(name)
		if err != nil {
			t.Fatalf("docs/%s: %v", name, err)
		}
		anchors := map[string]bool{}
		sc := bufio.NewScanner(bytes.NewReader(text))
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "#") {
				anchors[anchor(strings.TrimLeft(line, "#"))] = true
			}
		}
		docs[name] = anchors
	}
	link := regexp.MustCompile(`\]\(([^)#\s]*)#([^)\s]+)\)`)
	repoFiles(t, func(rel string, data []byte) {
		if !strings.HasSuffix(rel, ".md") {
			return
		}
		for _, m := range link.FindAllStringSubmatch(string(data), -1) {
			target, frag := m[1], m[2]
			if strings.Contains(target, "://") {
				continue // another site's page
			}
			// The file the link opens, as a reader on the repository's host resolves it:
			// relative to the linking file, so that "performance-log.md#x" from the README
			// (which has no such file beside it) fails here too.
			to := rel
			if target != "" {
				to = path.Join(path.Dir(rel), target)
			}
			anchors, ok := docs[strings.TrimPrefix(to, "docs/")]
			if !ok || !strings.HasPrefix(to, "docs/") {
				if strings.HasSuffix(target, "design.md") || strings.HasSuffix(target, "performance-log.md") {
					t.Errorf("%s links to %s#%s, which is no file: write the path from %s", rel, target, frag, path.Dir(rel))
				}
				continue
			}
			if !anchors[frag] {
				t.Errorf("%s links to %s#%s, which is no heading of %s", rel, to, frag, to)
			}
		}
	})
}

// section returns the text of design's "## name" section.
func section(t *testing.T, design, name string) string {
	t.Helper()
	start := strings.Index(design, "\n## "+name+"\n")
	if start < 0 {
		t.Fatalf("docs/design.md has no section %q", name)
	}
	rest := design[start+len(name)+5:]
	if end := strings.Index(rest, "\n## "); end >= 0 {
		rest = rest[:end]
	}
	return rest
}

// TestInvariantsAndDrillsKeepTheirNumbers: code, test names and workflowtest.Violation use
// invariants 1-6 and drills 1-7 by number; the document must list each, and every test the
// drill table names must exist.
func TestInvariantsAndDrillsKeepTheirNumbers(t *testing.T) {
	design := readDesign(t)
	inv := section(t, design, "Invariants")
	for n := 1; n <= 6; n++ {
		if !regexp.MustCompile(`(?m)^` + string(rune('0'+n)) + `\. \*\*`).MatchString(inv) {
			t.Errorf("docs/design.md, Invariants: no item %d", n)
		}
	}
	drills := section(t, design, "Fault drills")
	testName := regexp.MustCompile("`(Test[A-Za-z0-9_]+)`")
	var named []string
	for n := 1; n <= 7; n++ {
		row := regexp.MustCompile(`(?m)^\| ` + string(rune('0'+n)) + ` \|.*$`).FindString(drills)
		if row == "" {
			t.Errorf("docs/design.md, Fault drills: no row for drill %d", n)
			continue
		}
		if !testName.MatchString(row) {
			t.Errorf("docs/design.md, Fault drills: drill %d names no test", n)
		}
	}
	for _, m := range testName.FindAllStringSubmatch(drills, -1) {
		named = append(named, m[1]) // the table's and the text's
	}
	defined := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]+)\(`)
	repoFiles(t, func(rel string, data []byte) {
		if strings.HasSuffix(rel, "_test.go") {
			for _, m := range decl.FindAllSubmatch(data, -1) {
				defined[string(m[1])] = true
			}
		}
	})
	for _, name := range named {
		if !defined[name] {
			t.Errorf("docs/design.md, Fault drills, names %s, but no test of that name exists; update the table", name)
		}
	}
}
