package tests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/migrations"
)

// cliBinary builds cmd/idempotent into a directory of the test's own.
func cliBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "idempotent")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/txclaim/idempotent/cmd/idempotent").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// cliRun runs the CLI with env (plus the test's PATH and HOME) and returns
// its exit code and output.
func cliRun(t *testing.T, bin string, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("run %q: %v", args, err)
	}
	return code, out.String(), errOut.String()
}

func TestCLI(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	bin := cliBinary(t)
	schema := tempSchema(t, db)
	table := schema + ".claims"
	dsn := []string{"-dsn", pgDSN}
	ok := func(args ...string) string {
		t.Helper()
		code, stdout, stderr := cliRun(t, bin, nil, args...)
		if code != 0 || stderr != "" {
			t.Fatalf("idempotent %q: exit %d\nstdout: %s\nstderr: %s", args, code, stdout, stderr)
		}
		return stdout
	}

	t.Run("schema", func(t *testing.T) {
		want, _, err := migrations.SQL("app.claims", true)
		if err != nil {
			t.Fatal(err)
		}
		if got := ok("schema", "-table", "app.claims", "-partitioned"); got != want {
			t.Fatalf("schema printed\n%s\nwant\n%s", got, want)
		}
		if got := ok("schema", "-format", "goose"); !strings.HasPrefix(got, "-- +goose Up\n") || !strings.Contains(got, "-- +goose Down\nDROP TABLE IF EXISTS \"processed_messages\";") {
			t.Fatalf("goose format:\n%s", got)
		}
		kup, kdown, err := migrations.KafkaOffsetsSQL("app.offsets")
		if err != nil {
			t.Fatal(err)
		}
		if got := ok("schema", "-kafka-offsets", "app.offsets"); got != kup {
			t.Fatalf("schema -kafka-offsets printed\n%s\nwant\n%s", got, kup)
		}
		if got := ok("schema", "-kafka-offsets", "app.offsets", "-format", "golang-migrate-down"); got != kdown {
			t.Fatalf("schema -kafka-offsets -format golang-migrate-down printed %q, want %q", got, kdown)
		}
	})

	t.Run("migrate -kafka-offsets", func(t *testing.T) {
		claims, offsets := schema+".claims_k", schema+".offsets"
		out := ok(append([]string{"migrate", "-table", claims, "-kafka-offsets", offsets}, dsn...)...)
		if out != "offsets table "+offsets+" is ready\nclaim table "+claims+" is ready (plain, with its processed_at index)\n" {
			t.Fatalf("migrate printed %q", out)
		}
		if _, err := db.Exec("INSERT INTO " + offsets + " (consumer, topic, partition, next_offset) VALUES ('c', 't', 0, 5)"); err != nil {
			t.Fatalf("the offsets table is not there: %v", err)
		}
		ok(append([]string{"migrate", "-table", claims, "-kafka-offsets", offsets}, dsn...)...) // again: nothing to do
		code, _, stderr := cliRun(t, bin, nil, append([]string{"migrate", "-kafka-offsets", "bad name;"}, dsn...)...)
		if code != 2 || !strings.Contains(stderr, "kafka offsets table") {
			t.Fatalf("a bad offsets table name: exit %d, %q; want 2 naming the offsets table", code, stderr)
		}
	})

	t.Run("migrate, stats, cleanup", func(t *testing.T) {
		out := ok(append([]string{"migrate", "-table", table}, dsn...)...)
		if out != "claim table "+table+" is ready (plain, with its processed_at index)\n" {
			t.Fatalf("migrate printed %q", out)
		}
		old := time.Now().AddDate(0, 0, -40)
		retInsertClaims(t, db, table, "loyalty", "old", 2500, old)
		retInsertClaims(t, db, table, "analytics", "old", 500, old)
		retInsertClaims(t, db, table, "loyalty", "new", 10, time.Now())

		out = ok(append([]string{"stats", "-table", table}, dsn...)...)
		for _, re := range []string{
			`(?m)^table\s+` + regexp.QuoteMeta(table) + ` \(plain\)$`,
			`(?m)^size\s+table \d+(\.\d)? [kM]B, indexes \d+(\.\d)? [kM]B$`,
			`(?m)^claims\s+3010$`,
			`(?m)^analytics\s+500\s+\S+Z\s+\S+Z$`,
			`(?m)^loyalty\s+2510\s+\S+Z\s+\S+Z$`,
		} {
			if !regexp.MustCompile(re).MatchString(out) {
				t.Errorf("stats output does not match %s:\n%s", re, out)
			}
		}

		out = ok(append([]string{"cleanup", "-table", table, "-retention", "30d", "-dry-run"}, dsn...)...)
		if !strings.HasSuffix(out, "dry run: 3000 claims would be deleted\n") || !strings.Contains(out, "claims of every consumer processed before ") {
			t.Fatalf("dry run printed %q", out)
		}
		if n := retCount(t, db, table, ""); n != 3010 {
			t.Fatalf("dry run deleted: %d left", n)
		}

		out = ok(append([]string{"cleanup", "-table", table, "-retention", "30d", "-consumer", "loyalty", "-batch", "1000"}, dsn...)...)
		if !regexp.MustCompile(`(?m)^deleted 2500 claims in 4 batches, \S+ \(\d+ claims/s\); longest batch \S+$`).MatchString(out) {
			t.Fatalf("cleanup printed %q", out)
		}
		if n := retCount(t, db, table, "consumer = 'analytics'"); n != 500 {
			t.Fatalf("-consumer loyalty deleted analytics claims: %d left", n)
		}

		// A second runner while one is in a batch: exit 0, nothing deleted.
		tab, _ := dialect.ParseTable(table)
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		var got bool
		if err := tx.QueryRow(cleanupLock(tab)).Scan(&got); err != nil || !got {
			t.Fatal(got, err)
		}
		out = ok(append([]string{"cleanup", "-table", table, "-retention", "30d"}, dsn...)...)
		_ = tx.Rollback()
		if !strings.HasSuffix(out, "another cleanup of "+table+" is running and will finish the work; deleted 0 here\n") {
			t.Fatalf("busy cleanup printed %q", out)
		}

		// DATABASE_URL instead of -dsn.
		code, out, stderr := cliRun(t, bin, []string{"DATABASE_URL=" + pgDSN}, "cleanup", "-table", table, "-retention", "30d")
		if code != 0 || stderr != "" || !strings.Contains(out, "deleted 500 claims in 2 batches") {
			t.Fatalf("cleanup with DATABASE_URL: exit %d, %q, %q", code, out, stderr)
		}
		if n := retCount(t, db, table, ""); n != 10 {
			t.Fatalf("%d claims left, want the 10 new ones", n)
		}

		// A missing table is named.
		code, out, stderr = cliRun(t, bin, nil, append([]string{"cleanup", "-table", schema + ".nope", "-retention", "30d"}, dsn...)...)
		if code != 1 || !strings.Contains(stderr, "claim table does not exist: "+schema+".nope") || strings.Count(stderr, "\n") != 1 {
			t.Fatalf("cleanup of a missing table: exit %d, %q, %q", code, out, stderr)
		}
	})

	t.Run("cleanup progress on a terminal", func(t *testing.T) {
		script, err := exec.LookPath("script")
		if err != nil {
			t.Skip("no script(1) to give the CLI a terminal")
		}
		ttyTable := schema + ".tty"
		ok(append([]string{"migrate", "-table", ttyTable}, dsn...)...)
		retInsertClaims(t, db, ttyTable, "loyalty", "old", 3000, time.Now().AddDate(0, 0, -40))
		line := strings.Join([]string{bin, "cleanup", "-table", ttyTable, "-retention", "30d", "-batch", "1000", "-dsn", pq.QuoteLiteral(pgDSN)}, " ")
		out, err := exec.Command(script, "-qec", line, "/dev/null").CombinedOutput()
		if err != nil {
			t.Fatalf("script: %v\n%s", err, out)
		}
		s := string(out)
		for _, want := range []string{"\r\x1b[Kbatch 1: 1000 deleted, ", "\r\x1b[Kbatch 3: 3000 deleted, ", "\r\x1b[Kbatch 4: 3000 deleted, ", "deleted 3000 claims in 4 batches"} {
			if !strings.Contains(s, want) {
				t.Errorf("terminal output lacks %q:\n%q", want, s)
			}
		}
		// Without a terminal there is no progress line.
		retInsertClaims(t, db, ttyTable, "loyalty", "again", 10, time.Now().AddDate(0, 0, -40))
		if out := ok(append([]string{"cleanup", "-table", ttyTable, "-retention", "30d"}, dsn...)...); strings.Contains(out, "\r") {
			t.Errorf("progress written to a pipe: %q", out)
		}
	})

	t.Run("partitions", func(t *testing.T) {
		parted := schema + ".parted"
		out := ok(append([]string{"migrate", "-table", parted, "-partitioned", "-lead-days", "2"}, dsn...)...)
		now := time.Now()
		first := eventDayOf(now.Add(-30*24*time.Hour - 5*time.Minute))
		last := eventDayOf(now).AddDate(0, 0, 2)
		total := int(last.Sub(first).Hours()/24) + 1
		want := fmt.Sprintf("claim table %s is ready (partitioned by event day), %d day partitions from %s to %s\n", parted, total, first.Format(time.DateOnly), last.Format(time.DateOnly))
		if out != want {
			t.Fatalf("migrate -partitioned printed %q, want %q", out, want)
		}
		out = ok(append([]string{"partitions", "-table", parted, "-list"}, dsn...)...)
		if !strings.HasPrefix(out, first.Format(time.DateOnly)+"  parted_p"+first.Format("20060102")+"\n") || !strings.HasSuffix(out, fmt.Sprintf("%d partitions\n", total)) {
			t.Fatalf("partitions -list printed %q", out)
		}
		// A shorter window drops the older days.
		keepFrom := eventDayOf(now.Add(-3*24*time.Hour - 5*time.Minute))
		dropped := int(keepFrom.Sub(first).Hours() / 24)
		out = ok(append([]string{"partitions", "-table", parted, "-retention", "3d", "-lead-days", "2"}, dsn...)...)
		if !strings.HasPrefix(out, "dropped parted_p"+first.Format("20060102")+" ("+first.Format(time.DateOnly)+")\n") ||
			!strings.HasSuffix(out, fmt.Sprintf("%s: 0 created, %d dropped\n", parted, dropped)) {
			t.Fatalf("partitions printed %q (want %d dropped)", out, dropped)
		}
		out = ok(append([]string{"stats", "-table", parted}, dsn...)...)
		if !strings.Contains(out, "("+"partitioned by event day)") || !strings.Contains(out, fmt.Sprintf("\n%d partitions\n", total-dropped)) ||
			!regexp.MustCompile(`(?m)^parted_p\d{8}\s+\d{4}-\d\d-\d\d\s+0\s+\d+\.\d kB$`).MatchString(out) {
			t.Fatalf("stats of the partitioned table:\n%s", out)
		}
		// Maintaining a plain table is an error naming it.
		code, _, stderr := cliRun(t, bin, nil, append([]string{"partitions", "-table", table, "-retention", "30d"}, dsn...)...)
		if code != 1 || !strings.Contains(stderr, "claim table "+table+" is not partitioned") {
			t.Fatalf("partitions on a plain table: exit %d, %q", code, stderr)
		}
	})

	t.Run("no consumer of its own", func(t *testing.T) {
		// The commands work on the ClaimTable: the tool carries no consumer
		// name to run them under, so none can reach the table or clash with
		// a real consumer's.
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("idempotent-cli")) {
			t.Fatal("the CLI binary still carries the consumer name idempotent-cli")
		}
		shared := schema + ".shared"
		ok(append([]string{"migrate", "-table", shared}, dsn...)...)
		retInsertClaims(t, db, shared, "idempotent-cli", "old", 3, time.Now().AddDate(0, 0, -40))
		retInsertClaims(t, db, shared, "loyalty", "old", 4, time.Now().AddDate(0, 0, -40))
		out := ok(append([]string{"cleanup", "-table", shared, "-retention", "30d", "-consumer", "loyalty"}, dsn...)...)
		if !strings.Contains(out, "deleted 4 claims") || retCount(t, db, shared, "consumer = 'idempotent-cli'") != 3 {
			t.Fatalf("cleanup -consumer loyalty printed %q and left %d claims of a consumer named idempotent-cli, want 3", out, retCount(t, db, shared, "consumer = 'idempotent-cli'"))
		}
	})

	t.Run("unreachable database", func(t *testing.T) {
		code, stdout, stderr := cliRun(t, bin, []string{"DATABASE_URL=postgres://ops:Sup3rS3cret@127.0.0.1:1/x?sslmode=disable"}, "stats")
		if code != 1 || stdout != "" || strings.Count(stderr, "\n") != 1 ||
			!strings.HasPrefix(stderr, "idempotent stats: cannot reach the database at postgres://ops:xxxxx@127.0.0.1:1/x?sslmode=disable: ") ||
			strings.Contains(stderr, "Sup3rS3cret") {
			t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
	})

	t.Run("bad flags", func(t *testing.T) {
		code, stdout, stderr := cliRun(t, bin, nil, "cleanup", "-retention", "-5d", "-dsn", pgDSN)
		if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, `invalid value "-5d" for flag -retention`) {
			t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
	})
}

// eventDayOf returns the UTC midnight starting t's day.
func eventDayOf(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}
