package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	_ "github.com/lib/pq"

	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/postgres"
)

// seedDeadLetters writes two dead letters of consumer "payments" into the
// outbox table of schema s, shaped as kafka's (a DeadLetter payload under
// kind kafka-dead-letter), and returns their ids.
func seedDeadLetters(t *testing.T, db *sql.DB, s string, at time.Time) []int64 {
	t.Helper()
	ob, err := outbox.New(db, "payments", outbox.WithTable(s+".outbox"), outbox.WithoutNotify())
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for off, reason := range []string{"the ledger refused the payment", "no key: header idempotency-key missing"} {
		payload, _ := json.Marshal(map[string]any{
			"topic": "payments-dlq", "source_topic": "payments", "partition": 0, "offset": off,
			"key": []byte("acct-1"), "value": []byte(fmt.Sprintf(`{"id":"p-%d"}`, off)),
			"headers": []map[string]any{{"Key": "idempotency-key", "Value": []byte(fmt.Sprintf("p-%d", off))}},
			"error":   reason,
		})
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ob.Enqueue(context.Background(), tx, fmt.Sprintf("payments/0/%d", off), "kafka-dead-letter", payload, outbox.WithEventTime(at)); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := db.Query(`SELECT id FROM ` + s + `.outbox WHERE kind = 'kafka-dead-letter' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// tables summarizes the outbox and its audit table in schema s: what any
// change would move.
func tables(t *testing.T, db *sql.DB, s string) string {
	t.Helper()
	var out string
	var audit bool
	if err := db.QueryRow(`SELECT (SELECT count(*) || ' outbox rows, max id ' || COALESCE(max(id), 0) || ', kinds ' || COALESCE(string_agg(DISTINCT kind, ' '), '') FROM `+s+`.outbox),
	to_regclass($1) IS NOT NULL`, s+".outbox_dead_letter_audit").Scan(&out, &audit); err != nil {
		t.Fatal(err)
	}
	if audit {
		out += fmt.Sprintf("; audit %d", countRows(t, db, "SELECT count(*) FROM "+s+".outbox_dead_letter_audit"))
	}
	return out
}

// TestDeadLettersCLI runs dead-letters list, show, replay (twice) and
// discard against Postgres, and checks what each prints and writes.
func TestDeadLettersCLI(t *testing.T) {
	db := testenv.OpenPostgres(t, 4)
	s := testenv.UniqueName("dlcli")
	if _, err := db.Exec("CREATE SCHEMA " + s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP SCHEMA " + s + " CASCADE") })
	at := time.Date(2026, 11, 30, 23, 59, 59, 999999600, time.UTC)
	ids := seedDeadLetters(t, db, s, at)
	dsn := testenv.Getenv("IDEMPOTENT_POSTGRES_DSN", testenv.DefaultPostgresDSN)
	table := s + ".outbox"
	dl := func(args ...string) string {
		t.Helper()
		return cliOK(t, append(append([]string{"dead-letters"}, args...), "-dsn", dsn, "-table", table)...)
	}

	out := dl("list", "-topic", "payments")
	for _, re := range []string{
		fmt.Sprintf(`(?m)^%d\s+payments\s+kafka-dead-letter\s+payments/0/0\s+2026-11-30T23:59:59.9999996Z\s+pending\s+the ledger refused the payment$`, ids[0]),
		fmt.Sprintf(`(?m)^%d\s+payments\s+kafka-dead-letter\s+payments/0/1\s+`, ids[1]),
		`(?m)^2 dead letters in ` + regexp.QuoteMeta(table) + `$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("list does not match %s:\n%s", re, out)
		}
	}
	if out := dl("list", "-limit", "1"); !strings.HasSuffix(out, fmt.Sprintf("1 dead letters shown of %s; more after: -after %d\n", table, ids[0])) {
		t.Errorf("list -limit 1 printed:\n%s", out)
	}
	if out := dl("list", "-reason", "no key"); !strings.Contains(out, "payments/0/1") || strings.Contains(out, "payments/0/0") {
		t.Errorf("list -reason printed:\n%s", out)
	}
	out = dl("show", "-id", fmt.Sprint(ids[0]))
	for _, want := range []string{"key                      payments/0/0", "reason                   the ledger refused the payment",
		"event time               2026-11-30T23:59:59.9999996Z", "header                   idempotency-key: p-0", `payload                  {"id":"p-0"}`, "never replayed or discarded"} {
		if !strings.Contains(out, want) {
			t.Errorf("show does not print %q:\n%s", want, out)
		}
	}

	// Bad input: exit 2, one line, nothing changed, no password.
	before := tables(t, db, s)
	secretDSN := strings.Replace(dsn, "postgres@", "postgres:Pa55w0rdX@", 1)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"replay", "-by", "ops"}, "no filter: replay acts on the dead letters a filter selects"},
		{[]string{"discard", "-by", "ops"}, "no filter: discard"},
		{[]string{"replay", "-ids", fmt.Sprint(ids[0])}, "-by is required"},
		{[]string{"replay", "-ids", "1,x", "-by", "ops"}, `-ids: "x" is not an outbox row id`},
		{[]string{"discard", "-ids", "0", "-by", "ops"}, `-ids: "0" is not an outbox row id`},
		{[]string{"replay", "-from", "yesterday", "-by", "ops"}, `-from "yesterday"`},
		{[]string{"replay", "-from", "2026-12-01", "-before", "2026-11-01", "-by", "ops"}, "from 2026-12-01T00:00:00Z is not before 2026-11-01T00:00:00Z"},
		{[]string{"list", "-limit", "5000"}, "limit 5000, want 1 to 1000"},
		{[]string{"show"}, "-id is 0"},
		{[]string{"replay", "-ids", "1", "-by", "ops", "-kinds", "bad kind"}, `"bad kind"`},
		{[]string{"list", "-table", "a;b"}, `table name "a;b"`},
		{[]string{"drop"}, `unknown subcommand "drop"`},
	} {
		args := append([]string{"dead-letters"}, c.args...)
		if c.args[0] != "drop" {
			args = append(args, "-dsn", secretDSN)
			if !strings.Contains(strings.Join(c.args, " "), "-table") {
				args = append(args, "-table", table)
			}
		}
		code, stdout, stderr := runCLI(t, nil, args...)
		if code != 2 || !strings.Contains(stderr, c.want) || stdout != "" || strings.Count(strings.TrimSuffix(stderr, "\n"), "\n") != 0 {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and one line with %q", c.args, code, stdout, stderr, c.want)
		}
		if strings.Contains(stdout+stderr, "Pa55w0rdX") {
			t.Errorf("%q: password printed: %q", c.args, stderr)
		}
	}
	// An id that is not a dead letter: exit 1, nothing changed.
	code, stdout, stderr := runCLI(t, nil, "dead-letters", "replay", "-ids", fmt.Sprintf("%d,%d", ids[0], ids[1]+1000), "-by", "ops", "-dsn", dsn, "-table", table)
	if code != 1 || !strings.Contains(stderr, fmt.Sprintf("no such dead letter: %d in %s", ids[1]+1000, table)) || !strings.Contains(stderr, "nothing was done") || stdout != "" {
		t.Errorf("replay of an unknown id: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if got := tables(t, db, s); strings.TrimSuffix(got, "; audit 0") != before {
		t.Fatalf("bad input changed the tables: %s, was %s", got, before)
	}
	if out := dl("replay", "-reason", "refused", "-dry-run"); out != fmt.Sprintf("would replay %d (consumer payments, kafka-dead-letter, payments/0/0)\n1 dead letters would be replayed; nothing changed\n", ids[0]) {
		t.Errorf("replay -dry-run printed %q", out)
	}

	// Replay twice: two outbox rows of the replay kind, each its own key,
	// the original message key and event time; both recorded.
	for range 2 {
		out = dl("replay", "-ids", fmt.Sprint(ids[0]), "-by", "alice")
		if !regexp.MustCompile(fmt.Sprintf(`^replayed %d by alice \(outbox kind kafka-dead-letter-replay, idempotency key [0-9a-f]{64}\)\n1 dead letters replayed, recorded in %s\n$`, ids[0], regexp.QuoteMeta(s+".outbox_dead_letter_audit"))).MatchString(out) {
			t.Errorf("replay printed %q", out)
		}
	}
	var n, keys int
	var msgKey string
	var ev time.Time
	if err := db.QueryRow(`SELECT count(*), count(DISTINCT idempotency_key), min(message_key), min(event_time) FROM `+table+` WHERE kind = 'kafka-dead-letter-replay' AND payload::text = (SELECT payload::text FROM `+table+` WHERE id = $1)`, ids[0]).Scan(&n, &keys, &msgKey, &ev); err != nil {
		t.Fatal(err)
	}
	if n != 2 || keys != 2 || msgKey != "payments/0/0" || !ev.Equal(at.Truncate(time.Microsecond)) {
		t.Errorf("replay rows: %d, %d keys, message key %q, event time %v", n, keys, msgKey, ev)
	}
	if out := dl("show", "-id", fmt.Sprint(ids[0])); strings.Count(out, "replay by alice at ") != 2 {
		t.Errorf("show after two replays:\n%s", out)
	}

	// Discard the other: gone, recorded.
	if out := dl("discard", "-key", "payments/0/1", "-by", "bob"); out != fmt.Sprintf("discarded %d by bob\n1 dead letters discarded, recorded in %s\n", ids[1], s+".outbox_dead_letter_audit") {
		t.Errorf("discard printed %q", out)
	}
	code, _, stderr = runCLI(t, nil, "dead-letters", "show", "-id", fmt.Sprint(ids[1]), "-dsn", dsn, "-table", table)
	if code != 1 || !strings.Contains(stderr, "no such dead letter") {
		t.Errorf("show of a discarded dead letter: exit %d, %q", code, stderr)
	}
	var actor, reason string
	if err := db.QueryRow(`SELECT actor, reason FROM `+s+`.outbox_dead_letter_audit WHERE dead_letter_id = $1 AND action = 'discard'`, ids[1]).Scan(&actor, &reason); err != nil || actor != "bob" || !strings.Contains(reason, "no key") {
		t.Errorf("discard record: %q %q %v", actor, reason, err)
	}
	if out := dl("list"); !strings.HasSuffix(out, "1 dead letters in "+table+"\n") {
		t.Errorf("list after the discard:\n%s", out)
	}

	// stats shows the outbox beside the claim table, and its dead letters;
	// the HTTP response table is cleaned with the claims' window.
	claims := s + ".processed_messages"
	cliOK(t, "migrate", "-dsn", dsn, "-table", claims)
	if out := cliOK(t, "stats", "-dsn", dsn, "-table", claims); !regexp.MustCompile(`(?m)^outbox\s+` + regexp.QuoteMeta(table) + `: 3 pending \(0 leased, oldest \S+\), 0 given up; 1 dead letters \(idempotent dead-letters list\)$`).MatchString(out) {
		t.Errorf("stats does not show the outbox:\n%s", out)
	}
	checkHTTPResponses(t, dsn, claims, postgres.New(), db)
}

// TestDeadLettersCLIOtherDatabases: on MariaDB and SQLite, where no
// adapter writes dead letters (the outbox is Postgres only), every
// subcommand says so, exits 2 and touches nothing.
func TestDeadLettersCLIOtherDatabases(t *testing.T) {
	lite := filepath.Join(t.TempDir(), "app.db")
	for _, dsn := range []string{testenv.Getenv("IDEMPOTENT_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test"), "app:Pa55w0rdX@tcp(127.0.0.1:3306)/test", "mysql://app:Pa55w0rdX@127.0.0.1/test", "sqlite:" + lite} {
		for _, sub := range [][]string{{"list"}, {"show", "-id", "1"}, {"replay", "-ids", "1", "-by", "ops"}, {"discard", "-ids", "1", "-by", "ops"}} {
			code, stdout, stderr := runCLI(t, nil, append(append([]string{"dead-letters"}, sub...), "-dsn", dsn)...)
			if code != 2 || stdout != "" || !strings.Contains(stderr, "dead letters live in the outbox, which is Postgres only") || strings.Contains(stderr, "Pa55w0rdX") {
				t.Errorf("%s %q: exit %d, stdout %q, stderr %q", dsn, sub, code, stdout, stderr)
			}
		}
	}
	if _, err := os.Stat(lite); !os.IsNotExist(err) {
		t.Errorf("the SQLite file was created: %v", err)
	}
}
