package main

import (
	"strings"
	"testing"
)

// kafka-offsets reset moves a stored position: it refuses to run without
// every value given explicitly, and bad values, before touching the
// network; no message prints the password.
func TestKafkaOffsetsBadCommandLines(t *testing.T) {
	const dsn = "postgres://bob:Pa55w0rdX@127.0.0.1:1/x"
	full := func(extra ...string) []string {
		return append([]string{"kafka-offsets", "reset", "-dsn", dsn, "-table", "kafka_offsets", "-consumer", "payments", "-topic", "orders", "-partition", "0", "-offset", "5"}, extra...)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"kafka-offsets"}, "want list or reset"},
		{[]string{"kafka-offsets", "drop"}, `unknown subcommand "drop"`},
		{[]string{"kafka-offsets", "reset", "-dsn", dsn}, "-table, -consumer, -topic, -partition, -offset required"},
		{[]string{"kafka-offsets", "reset", "-dsn", dsn, "-table", "kafka_offsets", "-consumer", "payments", "-topic", "orders", "-partition", "0"}, "-offset required"},
		{[]string{"kafka-offsets", "reset", "-dsn", dsn, "-consumer", "payments", "-topic", "orders", "-partition", "0", "-offset", "5"}, "-table required"},
		{full("-offset", "-1"), "-offset is -1, want 0 or more"},
		{full("-partition", "-2"), "-partition is -2"},
		{full("-partition", "4294967296"), "-partition is 4294967296"},
		{full("-consumer", ""), "-consumer is empty"},
		{full("-consumer", "-x"), `consumer name "-x"`},
		{full("-topic", ""), "-topic is empty"},
		{full("-topic", strings.Repeat("t", 250)), "-topic is 250 bytes, want at most 249"},
		{full("-table", "a;b"), `table name "a;b": invalid identifier`},
		{full("extra"), `unexpected argument "extra"`},
		{[]string{"kafka-offsets", "list", "-table", "a;b", "-dsn", dsn}, `table name "a;b"`},
		{[]string{"kafka-offsets", "list"}, "no database: give -dsn or set DATABASE_URL"},
	} {
		code, stdout, stderr := runCLI(t, nil, c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) || stdout != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and %q", c.args, code, stdout, stderr, c.want)
		}
		if strings.Count(strings.TrimSuffix(stderr, "\n"), "\n") != 0 {
			t.Errorf("%q: stderr is not one line: %q", c.args, stderr)
		}
		if strings.Contains(stdout+stderr, "Pa55w0rdX") {
			t.Errorf("%q: password printed: %q", c.args, stderr)
		}
	}
	for _, args := range [][]string{full(), {"kafka-offsets", "list", "-dsn", dsn}} {
		code, stdout, stderr := runCLI(t, nil, args...)
		if code != 1 || !strings.Contains(stderr, "cannot reach the database at postgres://bob:xxxxx@") || strings.Contains(stdout+stderr, "Pa55w0rdX") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 1, the DSN redacted", args, code, stdout, stderr)
		}
	}
	for _, args := range [][]string{{"kafka-offsets", "-h"}, {"kafka-offsets", "reset", "-h"}, {"kafka-offsets", "list", "-help"}} {
		code, stdout, stderr := runCLI(t, nil, args...)
		if code != 0 || !strings.Contains(stdout, "Usage: idempotent kafka-offsets") || stderr != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
}
