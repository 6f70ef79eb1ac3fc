package main

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/txclaim/idempotent/internal/leakcheck"
)

// TestNoPasswordPrinted passes every generated connection string as -db,
// in the modes that take one, and fails if any piece of its password is
// printed. The strings name a port nothing listens on; a run that needs a
// part this build lacks stops where the build would start (scripts/test
// builds every part in).
func TestNoPasswordPrinted(t *testing.T) {
	saved := rebuildAndRun
	t.Cleanup(func() { rebuildAndRun = saved })
	rebuildAndRun = func(context.Context, []string, []string, io.Writer, io.Writer) int { return 1 }
	t.Chdir(t.TempDir())
	checked := 0
	for _, dsn := range leakcheck.Forms("1") {
		for _, mode := range [][]string{nil, {"-http"}, {"-broker", "pubsub"}, {"-broker", "kafka", "-kafka", "127.0.0.1:1"}} {
			args := append(append([]string{}, mode...), "-db", dsn.Value, "-orders", "100")
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), args, &stdout, &stderr)
			if leaks := leakcheck.Leaks(stdout.String() + stderr.String()); len(leaks) > 0 {
				t.Errorf("%s, %q: exit %d, the password printed (%q):\n%s%s", dsn.Form, mode, code, leaks, stdout.String(), stderr.String())
			}
			checked++
		}
	}
	t.Logf("%d runs, none printed a password", checked)
}
