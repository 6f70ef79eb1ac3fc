package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/mysql"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/sqlite"
)

// gapObserver records the gaps CheckGaps reports.
type gapObserver struct{ gaps []idempotent.Gap }

func (*gapObserver) Outcome(context.Context, idempotent.Event)    {}
func (*gapObserver) Retry(context.Context, idempotent.RetryEvent) {}
func (o *gapObserver) Gap(_ context.Context, g idempotent.Gap)    { o.gaps = append(o.gaps, g) }

// checkOrderCLI is the gap story through the CLI: sequence 5 of an
// account never arrives; 6 to 10 park; CheckGaps reports the gap to the
// observer and "order gaps" lists it; skips the CLI must refuse change
// nothing; "order skip" skips 5 and the consumer's CheckGaps applies 6 to
// 10 in order; a late 5 is refused naming it; stats and cleanup show the
// ordering tables and cleanup deletes none of their rows.
func checkOrderCLI(t *testing.T, dsn, table string, db *sql.DB, d dialect.Dialect) {
	t.Helper()
	ctx := context.Background()
	audit := table + "_audit"
	if _, err := db.Exec("CREATE TABLE " + audit + " (seq INTEGER NOT NULL, pos INTEGER NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	// The effect appends seq to the account's ledger, at the next position.
	apply := func(ctx context.Context, tx *sql.Tx, seq int64) error {
		_, err := tx.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (seq, pos) SELECT %d, COUNT(*) + 1 FROM %s", audit, seq, audit))
		return err
	}
	applied := func() []int64 {
		t.Helper()
		var out []int64
		rows, err := db.Query("SELECT seq FROM " + audit + " ORDER BY pos")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var s int64
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			out = append(out, s)
		}
		return out
	}
	clock := testenv.NewClock(time.Now().Add(-2 * time.Hour))
	obs := &gapObserver{}
	mw, err := idempotent.New(db, d, "ledger", idempotent.WithTable(table), idempotent.WithClock(clock.Now), idempotent.WithObserver(obs),
		idempotent.WithOrdering(idempotent.Ordering{
			Release: func(ctx context.Context, tx *sql.Tx, p idempotent.ParkedMessage) error {
				return apply(ctx, tx, p.OrderSeq)
			},
			GapTimeout: time.Hour,
		}))
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	process := func(seq int64) (idempotent.Outcome, error) {
		msg := idempotent.Message{Key: fmt.Sprintf("evt-%d", seq), OrderKey: "account:42", OrderSeq: seq, Payload: []byte("{}")}
		return mw.ProcessMessage(ctx, msg, func(ctx context.Context, tx *sql.Tx) error { return apply(ctx, tx, seq) })
	}
	for _, s := range []int64{1, 2, 3, 4, 6, 7, 8, 9, 10} {
		want := idempotent.Applied
		if s > 5 {
			want = idempotent.Parked
		}
		if out, err := process(s); err != nil || out != want {
			t.Fatalf("sequence %d: %v, %v; want %v", s, out, err, want)
		}
	}
	clock.Set(time.Now())
	if gaps, err := mw.CheckGaps(ctx); err != nil || len(gaps) != 1 || len(obs.gaps) != 1 || obs.gaps[0].NextParked != 6 {
		t.Fatalf("CheckGaps: %+v, %v; the observer was told %+v; want the gap after 4", gaps, err, obs.gaps)
	}

	out := cliOK(t, "order", "gaps", "-dsn", dsn, "-table", table)
	if !regexp.MustCompile(`(?m)^ledger\s+"account:42"\s+4\s+6\s+5\s+2h\S*\s+gap: 5 missing$`).MatchString(out) || !strings.HasSuffix(out, "\n1 gaps, 0 entities waiting for CheckGaps\n") {
		t.Fatalf("order gaps printed:\n%s", out)
	}
	if out := cliOK(t, "order", "gaps", "-dsn", dsn, "-table", table, "-older", "3h"); !strings.HasSuffix(out, "\n0 gaps, 0 entities waiting for CheckGaps\n") {
		t.Errorf("order gaps -older 3h printed:\n%s", out)
	}
	if out := cliOK(t, "stats", "-dsn", dsn, "-table", table); !regexp.MustCompile(`(?m)^ordering\s+\S+_order_seq: 1 entities of 1 consumers; \S+_order_parked: 5 parked messages of 1 entities, 0 skipped sequences`).MatchString(out) {
		t.Errorf("stats does not show the ordering tables:\n%s", out)
	}

	// Refused skips: nothing written.
	counts := func() string {
		s, p := d.(dialect.Orderer).OrderTables(dialect.Table{Name: table})
		return fmt.Sprint(countRows(t, db, "SELECT count(*) FROM "+s.Name), countRows(t, db, "SELECT COALESCE(SUM(last_seq), 0) FROM "+s.Name), countRows(t, db, "SELECT count(*) FROM "+p.Name))
	}
	before := counts()
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"ledger", "account:42", "6"}, 1, "sequence 6 is parked, not missing; skip at most up to 5"},
		{[]string{"ledger", "account:42", "4"}, 1, "sequence 4 is not ahead of the last applied, 4"},
		{[]string{"ledger", "account:7", "3"}, 1, `consumer "ledger" has no ordering key "account:7"`},
		{[]string{"billing", "account:42", "5"}, 1, `consumer "billing" has no ordering key "account:42"`},
		{[]string{"ledger", "account:42", "five"}, 2, `SEQ "five" is not a sequence number`},
		{[]string{"ledger", "account:42", "0"}, 2, `SEQ "0" is not a sequence number`},
		{[]string{"ledger", "account:42"}, 2, "want CONSUMER KEY SEQ, got 2 arguments"},
		{[]string{"ledger", strings.Repeat("k", 513), "5"}, 1, "ordering key of 513 bytes, the limit is 512"},
	} {
		code, stdout, stderr := runCLI(t, nil, append([]string{"order", "skip", "-dsn", dsn, "-table", table}, c.args...)...)
		if code != c.code || stdout != "" || !strings.Contains(stderr, c.want) || !strings.HasPrefix(stderr, "idempotent order: ") {
			t.Errorf("order skip %q: exit %d, stdout %q, stderr %q; want exit %d and %q", c.args, code, stdout, stderr, c.code, c.want)
		}
	}
	if after := counts(); after != before {
		t.Fatalf("refused skips changed the ordering tables: %s, then %s", before, after)
	}

	// The skip; flags after the arguments are read too.
	out = cliOK(t, "order", "skip", "-dsn", dsn, "ledger", "account:42", "5", "-table", table)
	if out != "consumer ledger, ordering key \"account:42\": skipped 5; the last applied is now 5\n5 parked messages (6..10) are next: the consumer's next CheckGaps applies them in order\n" {
		t.Fatalf("order skip printed %q", out)
	}
	if out := cliOK(t, "order", "gaps", "-dsn", dsn, "-table", table); !strings.Contains(out, "next: applied by the consumer's CheckGaps") || !strings.HasSuffix(out, "\n0 gaps, 1 entities waiting for CheckGaps\n") {
		t.Errorf("order gaps after the skip printed:\n%s", out)
	}
	if got := applied(); !slices.Equal(got, []int64{1, 2, 3, 4}) {
		t.Fatalf("the CLI's skip applied something itself: %v", got)
	}
	if _, err := mw.CheckGaps(ctx); err != nil {
		t.Fatal(err)
	}
	if got := applied(); !slices.Equal(got, []int64{1, 2, 3, 4, 6, 7, 8, 9, 10}) {
		t.Fatalf("after the skip and CheckGaps the ledger is %v; want 1..4, 6..10", got)
	}
	if _, err := process(5); !errors.Is(err, idempotent.ErrSkippedSequence) || !strings.Contains(err.Error(), "sequence 5") {
		t.Errorf("late 5 after the skip: %v; want ErrSkippedSequence naming it", err)
	}
	if out, err := process(11); err != nil || out != idempotent.Applied {
		t.Errorf("11 after the release: %v, %v; want Applied", out, err)
	}
	if out := cliOK(t, "order", "gaps", "-dsn", dsn, "-table", table); out != "CONSUMER  ORDER KEY  LAST APPLIED  NEXT PARKED  PARKED  WAITING  STATE\n0 gaps, 0 entities waiting for CheckGaps\n" {
		t.Errorf("order gaps at the end printed %q", out)
	}

	// Cleanup keeps the sequence row and the tombstone, and says so.
	out = cliOK(t, "cleanup", "-dsn", dsn, "-table", table, "-retention", "1d")
	if !regexp.MustCompile(`(?m)^kept \S+_order_seq \(1 entities\) and the 0 parked messages and 1 skipped sequences of \S+_order_parked: `).MatchString(out) {
		t.Errorf("cleanup printed:\n%s", out)
	}
	if n := countRows(t, db, "SELECT count(*) FROM "+audit); n != 10 {
		t.Errorf("%d effects applied, want 10", n)
	}
}

func TestOrderCLIOnPostgres(t *testing.T) {
	db := testenv.OpenPostgres(t, 4)
	s := testenv.UniqueName("ordercli")
	if _, err := db.Exec("CREATE SCHEMA " + s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP SCHEMA " + s + " CASCADE") })
	if _, err := db.Exec("SET search_path TO " + s); err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1) // the search_path is the one connection's
	dsn := testenv.Getenv("IDEMPOTENT_POSTGRES_DSN", testenv.DefaultPostgresDSN)
	checkOrderCLI(t, dsn+sep(dsn)+"search_path="+s, "claims", db, postgres.New())
}

// sep is the separator before a URL's next query parameter.
func sep(dsn string) string {
	if strings.Contains(dsn, "?") {
		return "&"
	}
	return "?"
}

func TestOrderCLIOnMariaDB(t *testing.T) {
	dsn := testenv.Getenv("IDEMPOTENT_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test")
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		testenv.Unavailable(t, "no MySQL/MariaDB at IDEMPOTENT_MYSQL_DSN (%s): %v", dsn, err)
	}
	table := testenv.UniqueName("ordcli")
	t.Cleanup(func() {
		for _, s := range []string{table, table + "_horizon", table + "_audit", table + "_order_seq", table + "_order_parked"} {
			_, _ = db.Exec("DROP TABLE IF EXISTS " + s)
		}
	})
	checkOrderCLI(t, dsn, table, db, mysql.New())
}

func TestOrderCLIOnSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "claims.db")
	db, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	checkOrderCLI(t, "sqlite:"+path, "claims", db, sqlite.New())
}
