// Package golden compares generated text, such as a dialect's SQL, with
// files under a package's testdata directory, and rewrites them when the
// test binary runs with -update.
package golden

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/ from the code's output")

// Updating reports whether the test binary runs with -update.
func Updating() bool { return *update }

// Compare fails t unless got equals the contents of the file at path. With
// -update it writes got to path instead.
func Compare(t testing.TB, path, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs (run go test -update if the change is intended, and review the diff):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// Statement renders a statement and its arguments for a golden file: the
// text, then the arguments on one line, strings quoted ([] when there are
// none).
func Statement(query string, args []any) string {
	shown := make([]string, len(args))
	for i, a := range args {
		shown[i] = fmt.Sprintf("%#v", a)
	}
	return query + "\n[" + strings.Join(shown, " ") + "]"
}
