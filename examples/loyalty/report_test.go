package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// Piped, a run's line is printed every pipedEvery while it lasts and once
// when it ends; nothing in between.
func TestProgressPrinterPiped(t *testing.T) {
	var out bytes.Buffer
	p := newProgressPrinter(&out)
	s := progress{name: "idempotent", settled: 10, total: 100}
	p.report(s)
	if out.Len() != 0 {
		t.Fatalf("printed before pipedEvery passed: %q", out.String())
	}
	p.last = time.Now().Add(-pipedEvery) // pipedEvery has passed
	p.report(s)
	p.report(s) // and not again at once
	s.settled, s.done = 100, true
	p.report(s)
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "   10/100 settled") || !strings.Contains(lines[1], "  100/100 settled") {
		t.Fatalf("printed %q; want the line at 10/100, then at 100/100", out.String())
	}
}
