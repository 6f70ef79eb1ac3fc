package main

import (
	"strings"
	"testing"
	"time"
)

// TestOrderedReport prints made-up rounds and checks the medians, the
// spreads and the targets' verdicts.
func TestOrderedReport(t *testing.T) {
	sample := func(pqOrd, pqPark, pgxOrd, pgxPark float64) orderedSample {
		return orderedSample{
			"lib/pq": {"process": 1000, "ordered": 1000 * pqOrd, "parked": 1000 * pqPark},
			"pgx":    {"process": 800, "ordered": 800 * pgxOrd, "parked": 800 * pgxPark},
		}
	}
	samples := []orderedSample{sample(1.2, 1.5, 1.0, 1.1), sample(1.3, 1.6, 1.1, 2.5), sample(1.1, 1.4, 0.9, 1.2)}
	var b strings.Builder
	orderedReport(&b, "15.20", []string{"-ordered", "-rounds", "3"}, orderedOptions{rounds: 3, messages: 300},
		time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC), time.Minute, []string{"lib/pq", "pgx"}, samples)
	out := b.String()
	for _, want := range []string{
		"## Ordered per key (WithOrdering) against ProcessMessage, lib/pq and pgx",
		"Command: `go run ./tests/bench -ordered -rounds 3`",
		"3 rounds of 300 messages",
		"| lib/pq | 1000 | 1200 | 1500 | **1.20×** [1.10–1.30] | **1.50×** [1.40–1.60] |",
		"| pgx | 800 | 800 | 960 | **1.00×** [0.90–1.10] | **1.20×** [1.10–2.50] |",
		"| in order ≤ 1.25× ProcessMessage | 1.20× yes | 1.00× yes |",
		"| parked then released ≤ 2× ProcessMessage | 1.50× yes | 1.20× yes |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
}
