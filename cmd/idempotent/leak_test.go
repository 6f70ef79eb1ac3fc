package main

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent/internal/leakcheck"
)

// cliArgs are every command that takes a database, with each of its flags
// that changes what it opens or prints.
var cliArgs = [][]string{
	{"stats"},
	{"stats", "-table", "demo.claims"},
	{"migrate"},
	{"migrate", "-partitioned", "-lead-days", "2"},
	{"migrate", "-kafka-offsets", "kafka_offsets"},
	{"cleanup", "-retention", "30d"},
	{"cleanup", "-retention", "30d", "-consumer", "loyalty", "-dry-run"},
	{"cleanup", "-retention", "30d", "-batch", "0"},
	{"partitions", "-retention", "30d"},
	{"partitions", "-list"},
	{"kafka-offsets", "list"},
	{"kafka-offsets", "list", "-consumer", "loyalty", "-topic", "orders"},
	{"kafka-offsets", "reset", "-table", "kafka_offsets", "-consumer", "loyalty", "-topic", "orders", "-partition", "0", "-offset", "1"},
	{"cleanup", "-retention", "30d", "-http-responses"},
	{"dead-letters", "list"},
	{"dead-letters", "show", "-id", "1"},
	{"dead-letters", "replay", "-ids", "1", "-by", "ops"},
	{"dead-letters", "discard", "-key", "payments/0/1", "-by", "ops"},
}

// TestNoPasswordPrinted passes every generated connection string (every
// form, right and wrong, with passwords full of the characters that break
// parsers) through every command and flag, as -dsn and as DATABASE_URL,
// and fails if any piece of the password is printed. The strings name a
// port nothing listens on, so every command gets as far as connecting;
// TestNoPasswordPrintedByServers does the same against the servers.
func TestNoPasswordPrinted(t *testing.T) {
	t.Chdir(t.TempDir()) // migrate may create an SQLite file
	noDNS(t)
	saved := connectTimeout
	connectTimeout = 2 * time.Second
	t.Cleanup(func() { connectTimeout = saved })
	checked := 0
	for _, dsn := range leakcheck.Forms("1") {
		for _, args := range cliArgs {
			for _, viaEnv := range []bool{false, true} {
				a, env := append([]string{}, args...), map[string]string{}
				if viaEnv {
					env["DATABASE_URL"] = dsn.Value
				} else {
					a = append(a, "-dsn", dsn.Value)
				}
				code, stdout, stderr := runCLI(t, env, a...)
				if leaks := leakcheck.Leaks(stdout + stderr); len(leaks) > 0 {
					t.Errorf("%s, %q (DATABASE_URL: %v): exit %d, the password printed (%q):\n%s%s", dsn.Form, args, viaEnv, code, leaks, stdout, stderr)
				}
				checked++
			}
		}
	}
	t.Logf("%d command lines, none printed a password", checked)
}

// TestNoPasswordPrintedByServers is TestNoPasswordPrinted against the
// test servers, whose own errors (a login refused) the commands print.
func TestNoPasswordPrintedByServers(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no servers")
	}
	t.Chdir(t.TempDir())
	noDNS(t)
	for server, port := range map[string]string{"postgres": "5432", "mysql": "3306"} {
		for _, dsn := range leakcheck.Forms(port) {
			if dsn.Server != server {
				continue
			}
			for _, args := range [][]string{{"stats"}, {"migrate"}, {"dead-letters", "list"}} {
				code, stdout, stderr := runCLI(t, nil, append(args, "-dsn", dsn.Value)...)
				if leaks := leakcheck.Leaks(stdout + stderr); len(leaks) > 0 {
					t.Errorf("%s, %q: exit %d, the password printed (%q):\n%s%s", dsn.Form, args, code, leaks, stdout, stderr)
				}
				if code == 0 && !strings.HasPrefix(dsn.Value, "sqlite:") {
					t.Errorf("%s, %q: exit 0 for user bob", dsn.Form, args)
				}
			}
		}
	}
}

// noDNS makes every name lookup but /etc/hosts's fail for the test's
// length: a mangled connection string must not send a query off the
// machine.
func noDNS(t *testing.T) {
	saved := net.DefaultResolver
	net.DefaultResolver = &net.Resolver{PreferGo: true, Dial: func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("no DNS in this test")
	}}
	t.Cleanup(func() { net.DefaultResolver = saved })
}
