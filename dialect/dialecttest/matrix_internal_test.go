package dialecttest

import (
	"database/sql"
	"strings"
	"testing"
)

// TestMatrixNames: every mode and every scenario has a name of its own,
// and there are as many as the package doc and docs/guarantees.md list.
func TestMatrixNames(t *testing.T) {
	var modes []string
	for _, m := range Modes() {
		modes = append(modes, m.Name)
	}
	var cells []string
	for _, s := range scenarios[*sql.Tx]() {
		cells = append(cells, s.name)
	}
	for _, names := range [][]string{modes, cells} {
		seen := map[string]bool{}
		for _, n := range names {
			if seen[n] || n == "" || strings.ContainsAny(n, " \t") {
				t.Errorf("name %q is empty, has white space or is given twice", n)
			}
			seen[n] = true
		}
	}
	if len(modes) != 13 || len(cells) != 21 {
		t.Errorf("%d modes and %d scenarios; the docs count 13 and 21 (9 claim, retention and edge scenarios, 12 mistakes)", len(modes), len(cells))
	}
}
