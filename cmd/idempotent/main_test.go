package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

func TestParseDays(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"30d":   30 * 24 * time.Hour,
		"1d12h": 36 * time.Hour,
		"36h":   36 * time.Hour,
		"90m":   90 * time.Minute,
		"0d":    0,
	} {
		got, err := parseDays(in)
		if err != nil || got != want {
			t.Errorf("parseDays(%q) = (%v, %v), want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "d", "30x", "x30d", "-1d", "1d-", "3dd"} {
		if got, err := parseDays(in); err == nil && in != "" {
			t.Errorf("parseDays(%q) = %v, want an error", in, got)
		}
	}
	for d, want := range map[time.Duration]string{
		30 * 24 * time.Hour: "30d", 36 * time.Hour: "1d12h", 5 * time.Minute: "5m", 2 * time.Hour: "2h", 90 * time.Second: "1m30s",
	} {
		if got := formatDays(d); got != want {
			t.Errorf("formatDays(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestRedaction(t *testing.T) {
	noEnv := func(string) string { return "" }
	for _, c := range []struct{ dsn, shown, secret string }{
		{"postgres://bob:s3cr%40t@db:5432/app?sslmode=disable", "postgres://bob:xxxxx@db:5432/app?sslmode=disable", "s3cr@t"},
		{"postgres://bob@db/app?password=hunter2&sslmode=require", "postgres://bob@db/app?password=xxxxx&sslmode=require", "hunter2"},
		{"host=db user=bob password=hunter2 dbname=app", "host=db user=bob password=xxxxx dbname=app", "hunter2"},
		{"host=db password='two words' dbname=app", "host=db password=xxxxx dbname=app", "two words"},
		{"postgres://bob@db/app", "postgres://bob@db/app", ""},
	} {
		if got := redactDSN(c.dsn); got != c.shown {
			t.Errorf("redactDSN(%q) = %q, want %q", c.dsn, got, c.shown)
		}
		s := secrets(c.dsn, noEnv)
		if c.secret == "" {
			if len(s) != 0 {
				t.Errorf("secrets(%q) = %q, want none", c.dsn, s)
			}
			continue
		}
		msg := scrub("failed for "+c.secret+" at "+c.dsn, s)
		if strings.Contains(msg, c.secret) || strings.Contains(msg, "s3cr%40t") {
			t.Errorf("scrub left the password of %q in %q", c.dsn, msg)
		}
	}
	if got := scrub("auth failed: pw-from-env", secrets("host=db", func(k string) string {
		if k == "PGPASSWORD" {
			return "pw-from-env"
		}
		return ""
	})); strings.Contains(got, "pw-from-env") {
		t.Errorf("PGPASSWORD leaked: %q", got)
	}
}

// runCLI runs the command line in process, with no DATABASE_URL.
func runCLI(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, envFor(env, &out, &errOut))
	return code, out.String(), errOut.String()
}

func envFor(vars map[string]string, out, errOut *bytes.Buffer) env {
	return env{getenv: func(k string) string { return vars[k] }, stdout: out, stderr: errOut}
}

func TestBadCommandLinesExitTwoWithOneLine(t *testing.T) {
	const dsn = "postgres://bob:pw@127.0.0.1:1/x"
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "Usage: idempotent COMMAND"},
		{[]string{"vacuum"}, `idempotent: unknown command "vacuum"`},
		{[]string{"schema", "-kafka-offsets", "kafka_offsets", "-partitioned"}, "-kafka-offsets and -partitioned: the offsets table is not partitioned"},
		{[]string{"schema", "-kafka-offsets", "a;b"}, "kafka offsets table"},
		{[]string{"schema", "-kafka-offsets", "kafka_offsets", "-format", "xml"}, `-format "xml"`},
		{[]string{"migrate", "-kafka-offsets", "a;b", "-dsn", dsn}, "kafka offsets table"},
		{[]string{"cleanup", "-bogus"}, "idempotent cleanup: flag provided but not defined: -bogus"},
		{[]string{"cleanup", "-dsn", dsn}, "-retention is required"},
		{[]string{"cleanup", "-retention", "0d", "-dsn", dsn}, "-retention is 0s, want a positive duration"},
		{[]string{"cleanup", "-retention", "30x", "-dsn", dsn}, `invalid value "30x" for flag -retention`},
		{[]string{"cleanup", "-retention", "30d", "-batch", "0", "-dsn", dsn}, "-batch is 0, want at least 1"},
		{[]string{"cleanup", "-retention", "30d", "-batch", "10", "-min-batch", "20", "-dsn", dsn}, "-min-batch 20 is larger than -batch 10"},
		{[]string{"cleanup", "-retention", "30d", "-statement-timeout", "0s", "-dsn", dsn}, "-statement-timeout is 0s"},
		{[]string{"cleanup", "-retention", "30d"}, "no database: give -dsn or set DATABASE_URL"},
		{[]string{"cleanup", "-retention", "30d", "-table", "a;b", "-dsn", dsn}, `table name "a;b": invalid identifier`},
		{[]string{"cleanup", "-retention", "30d", "-consumer", "-x", "-dsn", dsn}, `consumer name "-x"`},
		{[]string{"partitions", "-dsn", dsn}, "-retention is required"},
		{[]string{"partitions", "-retention", "30d", "-lead-days", "0", "-dsn", dsn}, "-lead-days is 0, want at least 1"},
		{[]string{"migrate", "-partitioned", "-lead-days", "-1", "-dsn", dsn}, "-lead-days is -1, want at least 1"},
		{[]string{"schema", "-format", "xml"}, `-format "xml": want sql, goose`},
		{[]string{"schema", "extra"}, `unexpected argument "extra"`},
		{[]string{"stats", "-dsn", dsn, "now"}, `unexpected argument "now"`},
	} {
		code, stdout, stderr := runCLI(t, nil, c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) || stdout != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and %q", c.args, code, stdout, stderr, c.want)
		}
		if len(c.args) > 0 && strings.Count(strings.TrimSuffix(stderr, "\n"), "\n") != 0 {
			t.Errorf("%q: stderr is not one line: %q", c.args, stderr)
		}
		if strings.Contains(stderr, ":pw@") {
			t.Errorf("%q: password printed: %q", c.args, stderr)
		}
	}
}

func TestHelpExitsZero(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"cleanup", "-h"}, {"schema", "-help"}} {
		code, stdout, stderr := runCLI(t, nil, args...)
		if code != 0 || !strings.Contains(stdout, "Usage: idempotent") || stderr != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
}

func TestUnreachableDatabaseExitsOneWithoutThePassword(t *testing.T) {
	for _, dsn := range []string{
		"postgres://bob:Pa55w0rdX@127.0.0.1:1/x?sslmode=disable",
		"host=127.0.0.1 port=1 user=bob password=Pa55w0rdX dbname=x sslmode=disable",
	} {
		for _, args := range [][]string{
			{"stats", "-dsn", dsn},
			{"cleanup", "-retention", "30d", "-dsn", dsn},
			{"migrate", "-dsn", dsn},
			{"partitions", "-retention", "30d", "-dsn", dsn},
		} {
			code, stdout, stderr := runCLI(t, nil, args...)
			if code != 1 || !strings.Contains(stderr, "cannot reach the database at ") || strings.Count(stderr, "\n") != 1 {
				t.Errorf("%q: exit %d, stderr %q; want exit 1 and one line", args, code, stderr)
			}
			if strings.Contains(stdout+stderr, "Pa55w0rdX") {
				t.Errorf("%q: password printed: %q %q", args, stdout, stderr)
			}
		}
		// The same through DATABASE_URL.
		code, _, stderr := runCLI(t, map[string]string{"DATABASE_URL": dsn}, "stats")
		if code != 1 || strings.Contains(stderr, "Pa55w0rdX") || !strings.Contains(stderr, "xxxxx") {
			t.Errorf("DATABASE_URL: exit %d, stderr %q", code, stderr)
		}
	}
}
