package tests

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/sqlite"
)

// docCommand is one "$ idempotent …" line of a sample in the docs and
// what follows it up to the next: the output, and the exit status when it
// is not 0.
type docCommand struct {
	line int // in the Markdown file
	args []string
	out  []string
	code int
}

// docSamples reads the shell samples of a Markdown file: the plain ```
// blocks that start with "$ idempotent".
func docSamples(t *testing.T, path string) [][]docCommand {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var blocks [][]docCommand
	var cur []docCommand
	in, plain := false, false
	for i, l := range strings.Split(string(b), "\n") {
		switch {
		case !in && strings.HasPrefix(strings.TrimSpace(l), "```"):
			in, plain, cur = true, strings.TrimSpace(l) == "```", nil
		case in && strings.TrimSpace(l) == "```":
			in = false
			if plain && len(cur) > 0 {
				blocks = append(blocks, cur)
			}
		case in && strings.HasPrefix(l, "$ idempotent "):
			cur = append(cur, docCommand{line: i + 1, args: shellWords(t, strings.TrimPrefix(l, "$ idempotent "))})
		case in && len(cur) > 0 && strings.HasPrefix(l, "exit status "):
			cur[len(cur)-1].code, _ = strconv.Atoi(strings.TrimPrefix(l, "exit status "))
		case in && len(cur) > 0:
			cur[len(cur)-1].out = append(cur[len(cur)-1].out, l)
		}
	}
	return blocks
}

// shellWords splits a sample's command line as sh does its simple words
// and single quotes.
func shellWords(t *testing.T, s string) []string {
	var words []string
	var w strings.Builder
	quoted, any := false, false
	for _, r := range s {
		switch {
		case r == '\'':
			quoted, any = !quoted, true
		case r == ' ' && !quoted:
			if any {
				words = append(words, w.String())
			}
			w.Reset()
			any = false
		default:
			w.WriteRune(r)
			any = true
		}
	}
	if any {
		words = append(words, w.String())
	}
	return words
}

// sampleNoise are what varies from run to run: times, dates, durations,
// sizes and counts, in that order.
var sampleNoise = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`), "TIME"},
	{regexp.MustCompile(`\d{4}-\d\d-\d\d`), "DAY"},
	{regexp.MustCompile(`p\d{8}\b`), "pDAY"},
	{regexp.MustCompile(`\b\d+(\.\d+)?(ms|µs|s|m|h)\b`), "DURATION"},
	{regexp.MustCompile(`\b\d+(\.\d+)? (B|kB|MB|GB)\b`), "SIZE"},
	{regexp.MustCompile(`topic ID [A-Za-z0-9_-]+`), "topic ID ID"},
	{regexp.MustCompile(`\d+`), "N"},
	{regexp.MustCompile(`\s+`), " "},
}

func normalizeSample(s string) string {
	for _, n := range sampleNoise {
		s = n.re.ReplaceAllString(s, n.with)
	}
	return strings.TrimSpace(s)
}

// TestOperationsDocShowsTheRealCLI runs every command of docs/operations.md's
// samples against the test servers, in the order shown, and checks that
// it prints what the sample shows, but for times, sizes and counts: a
// line for a line ("…" stands for any lines), and the exit status.
// Names the docs use (the schema demo, /var/lib/loyalty, claims_by_day on
// MariaDB) are replaced by the test's own, and back in the output.
func TestOperationsDocShowsTheRealCLI(t *testing.T) {
	db := openDB(t)
	my, err := sql.Open("mysql", mysqlDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = my.Close() })
	bin := cliBinary(t)
	schema := tempSchema(t, db)
	dir := t.TempDir()
	myTable := uniqueName("claims_by_day")
	t.Cleanup(func() {
		_, _ = my.Exec("DROP TABLE IF EXISTS " + myTable + ", " + myTable + "_horizon")
	})
	rename := strings.NewReplacer("demo.", schema+".", "/var/lib/loyalty", dir)
	back := strings.NewReplacer(schema+".", "demo.", dir, "/var/lib/loyalty", myTable, "claims_by_day")
	env := []string{"DATABASE_URL=" + pgDSN}

	// The data the samples show: two consumers' claims, some past the
	// window, in the plain tables; stored kafka offsets.
	seed := func(q string, args ...any) {
		t.Helper()
		if _, err := db.Exec(q, args...); err != nil {
			t.Fatal(err)
		}
	}
	seedPlain := func(t *testing.T, table string) {
		code, _, stderr := cliRun(t, bin, env, "migrate", "-table", table)
		if code != 0 {
			t.Fatalf("migrate %s: %s", table, stderr)
		}
		seed(`INSERT INTO ` + table + ` (consumer, message_key, processed_at)
SELECT c, c || g, now() - make_interval(days => 45 - g % 44) FROM generate_series(1, 300) g, unnest(ARRAY['analytics', 'loyalty']) c`)
	}
	seedPlain(t, schema+".processed_messages")
	lite := filepath.Join(dir, "loyalty.db")
	if code, _, stderr := cliRun(t, bin, nil, "migrate", "-dsn", "sqlite:"+lite); code != 0 {
		t.Fatal(stderr)
	}
	ldb, err := sql.Open(sqlite.DriverName, lite)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		for _, c := range []string{"analytics", "loyalty"} {
			if _, err := ldb.Exec("INSERT INTO processed_messages (consumer, message_key, processed_at) VALUES (?, ?, strftime('%Y-%m-%d %H:%M:%f', 'now', ?))",
				c, fmt.Sprint(c, i), fmt.Sprintf("-%d days", 45-i%44)); err != nil {
				t.Fatal(err)
			}
		}
	}
	_ = ldb.Close()
	// The -tenants sample's file: the loyalty database above and one more.
	if code, _, stderr := cliRun(t, bin, nil, "migrate", "-dsn", "sqlite:"+filepath.Join(dir, "globex.db")); code != 0 {
		t.Fatal(stderr)
	}
	if err := os.WriteFile(filepath.Join(dir, "tenants"), []byte("acme=sqlite:"+lite+"\nglobex=sqlite:"+filepath.Join(dir, "globex.db")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for p, off := range []string{"1042", "977"} {
		if code, _, stderr := cliRun(t, bin, env, "migrate", "-table", schema+".claims_k", "-kafka-offsets", schema+".kafka_offsets"); code != 0 {
			t.Fatal(stderr)
		}
		if code, _, stderr := cliRun(t, bin, env, "kafka-offsets", "reset", "-table", schema+".kafka_offsets", "-consumer", "payments", "-topic", "orders", "-partition", fmt.Sprint(p), "-offset", off); code != 0 {
			t.Fatal(stderr)
		}
	}

	seedDocDeadLetters(t, db, schema)
	seedDocGap(t, db, schema)

	checked := 0
	for _, block := range docSamples(t, filepath.Join("..", "docs", "operations.md")) {
		for _, c := range block {
			if slices.ContainsFunc(c.out, regexp.MustCompile(`^batch \d+: `).MatchString) {
				continue // a terminal's progress line, which a pipe does not get
			}
			args := make([]string, len(c.args))
			for i, a := range c.args {
				args[i] = rename.Replace(a)
			}
			if line := strings.Join(c.args, " "); strings.Contains(line, "mysql://") || strings.Contains(line, "tcp(127.0.0.1:3306)") {
				for i, a := range args {
					if a == "claims_by_day" {
						args[i] = myTable
					}
				}
			}
			code, stdout, stderr := cliRun(t, bin, env, args...)
			got := strings.Split(strings.TrimSuffix(back.Replace(stdout+stderr), "\n"), "\n")
			if msg := matchSample(c.out, got); msg != "" || code != c.code {
				t.Errorf("docs/operations.md:%d: idempotent %s: exit %d (the sample shows %d); %s\nit printed:\n%s",
					c.line, strings.Join(c.args, " "), code, c.code, msg, strings.Join(got, "\n"))
			}
			checked++
		}
	}
	if checked < 20 {
		t.Errorf("only %d commands checked", checked)
	}
}

// matchSample compares a sample's lines with what the command printed,
// normalized; "…" stands for any number of lines. It returns "" when they
// match, or the first difference.
func matchSample(want, got []string) string {
	var match func(w, g int) bool
	match = func(w, g int) bool {
		switch {
		case w == len(want):
			return g == len(got)
		case normalizeSample(want[w]) == "…":
			for k := g; k <= len(got); k++ {
				if match(w+1, k) {
					return true
				}
			}
			return false
		case g == len(got):
			return false
		}
		return normalizeSample(want[w]) == normalizeSample(got[g]) && match(w+1, g+1)
	}
	if match(0, 0) {
		return ""
	}
	for i := range want {
		switch {
		case normalizeSample(want[i]) == "…":
			return "they differ after a \"…\""
		case i >= len(got):
			return fmt.Sprintf("the sample's line %q is missing", want[i])
		case normalizeSample(want[i]) != normalizeSample(got[i]):
			return fmt.Sprintf("the sample shows %q where it printed %q", want[i], got[i])
		}
	}
	return fmt.Sprintf("it printed %q after what the sample shows", got[len(want)])
}

// seedDocDeadLetters writes the two dead letters docs/operations.md shows
// into the outbox of schema: poison Kafka records of consumer payments, as
// kafka.WithDeadLetter writes them, already sent to the dead-letter topic.
func seedDocDeadLetters(t *testing.T, db *sql.DB, schema string) {
	t.Helper()
	ob, err := outbox.New(db, "payments", outbox.WithTable(schema+".outbox"), outbox.WithoutNotify())
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		offset     int
		key, value string
		err        string
	}{
		{17, "", `{"id":"pay-4410","account":"acct-9",`, "decode: unexpected end of JSON input"},
		{18, "pay-4411", `{"id":"pay-4411","account":"acct-9","amount":1200}`, "the ledger refused the payment: account acct-9 is frozen"},
	} {
		headers := []map[string]any{{"Key": "Idempotent-Event-Time", "Value": []byte("2026-11-30T09:14:02.5Z")}}
		if r.key != "" {
			headers = append([]map[string]any{{"Key": "idempotency-key", "Value": []byte(r.key)}}, headers...)
		}
		payload, _ := json.Marshal(map[string]any{"topic": "payments-dlq", "source_topic": "payments", "partition": 0, "offset": r.offset,
			"key": []byte("acct-9"), "value": []byte(r.value), "headers": headers, "error": r.err})
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		at, _ := time.Parse(time.RFC3339Nano, "2026-11-30T09:14:02.5Z")
		if _, err := ob.Enqueue(context.Background(), tx, fmt.Sprintf("payments/0/%d", r.offset), "kafka-dead-letter", payload, outbox.WithEventTime(at)); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Exec(`UPDATE ` + schema + `.outbox SET state = 'sent', sent_at = now(), attempts = 1`); err != nil {
		t.Fatal(err)
	}
}

// seedDocGap makes the gap docs/operations.md shows: consumer ledger,
// created WithOrdering on the claim table ledger_claims of schema, applied
// sequences 1 to 4 of account:42 and parked 6 to 10.
func seedDocGap(t *testing.T, db *sql.DB, schema string) {
	t.Helper()
	ctx := context.Background()
	mw, err := idempotent.New(db, postgres.New(), "ledger", idempotent.WithTable(schema+".ledger_claims"),
		idempotent.WithOrdering(idempotent.Ordering{Release: func(context.Context, *sql.Tx, idempotent.ParkedMessage) error { return nil }}))
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	for _, seq := range []int64{1, 2, 3, 4, 6, 7, 8, 9, 10} {
		msg := idempotent.Message{Key: fmt.Sprintf("evt-%d", seq), OrderKey: "account:42", OrderSeq: seq, Payload: []byte("{}")}
		if _, err := mw.ProcessMessage(ctx, msg, func(context.Context, *sql.Tx) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
}
