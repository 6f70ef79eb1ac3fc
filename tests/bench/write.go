package main

// -write: the run's sections go into a Markdown file (BENCHMARKS.md)
// themselves, never copied by hand.

import (
	"fmt"
	"os"
	"strings"
)

// spliceSections returns doc with each "## " section of out in place of
// doc's section of the same heading line — from that line to the next
// "## " line, or the end — and the sections doc lacks appended.
func spliceSections(doc, out string) string {
	for _, sec := range splitSections(out) {
		heading, _, _ := strings.Cut(sec, "\n")
		start := -1
		if strings.HasPrefix(doc, heading+"\n") {
			start = 0
		} else if i := strings.Index(doc, "\n"+heading+"\n"); i >= 0 {
			start = i + 1
		}
		body := strings.TrimRight(sec, "\n") + "\n"
		if start < 0 {
			doc = strings.TrimRight(doc, "\n") + "\n\n" + body
			continue
		}
		end := len(doc)
		if i := strings.Index(doc[start+len(heading):], "\n## "); i >= 0 {
			end = start + len(heading) + i + 1
			body += "\n"
		}
		doc = doc[:start] + body + doc[end:]
	}
	return doc
}

// splitSections returns the "## " sections of out, each from its heading
// line to the next one; what comes before the first is dropped.
func splitSections(out string) []string {
	var secs []string
	for _, part := range strings.Split("\n"+out, "\n## ")[1:] {
		secs = append(secs, "## "+part)
	}
	return secs
}

// writeSections splices out's sections into the file at path.
func writeSections(path, out string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("-write: %w", err)
	}
	if len(splitSections(out)) == 0 {
		return fmt.Errorf("-write: the run printed no section to write to %s", path)
	}
	if err := os.WriteFile(path, []byte(spliceSections(string(doc), out)), 0o644); err != nil {
		return fmt.Errorf("-write: %w", err)
	}
	return nil
}
