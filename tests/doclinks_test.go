package tests

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// mdLink matches a Markdown link's target: the text in ](…).
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocLinksResolve checks that every relative link in README.md,
// CHANGELOG.md and docs/*.md points at a file or directory of the
// repository, and that a link to a heading of a Markdown file names one of
// its headings.
func TestDocLinksResolve(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "README.md"), filepath.Join(root, "CHANGELOG.md"))
	checked := 0
	for _, file := range files {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, file)
		for _, m := range mdLink.FindAllStringSubmatch(string(text), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			dest := file
			if path != "" {
				dest = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
			}
			destRel, _ := filepath.Rel(root, dest)
			checked++
			if _, err := os.Stat(dest); err != nil {
				t.Errorf("%s: link %q: %s does not exist", rel, target, destRel)
				continue
			}
			if anchor != "" && strings.HasSuffix(dest, ".md") {
				body, err := os.ReadFile(dest)
				if err != nil {
					t.Fatal(err)
				}
				if !hasHeading(string(body), anchor) {
					t.Errorf("%s: link %q: %s has no heading #%s", rel, target, destRel, anchor)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative links found: is the test run from the tests directory?")
	}
}

// hasHeading reports whether markdown has a heading whose GitHub anchor is
// anchor: lower case, spaces as hyphens, punctuation other than - and _
// dropped.
func hasHeading(markdown, anchor string) bool {
	for line := range strings.SplitSeq(markdown, "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r > 127 && unicode.IsLetter(r):
				b.WriteRune(r)
			}
		}
		if b.String() == anchor {
			return true
		}
	}
	return false
}
