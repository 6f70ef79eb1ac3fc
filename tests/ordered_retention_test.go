package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/postgres"
)

// TestOrderedEntityAfterCleanup is the retention rule of ordered mode
// (docs/operations.md, "Ordered consumers and retention"): Cleanup deletes
// an ordered entity's claims, applied and parked alike, and never its
// sequence row, its parked messages or its skipped sequences. Its next
// messages are then decided by the sequence row: a replay of an applied
// message is Duplicate; a redelivery of a parked message whose claim is
// gone is a Duplicate of the parked one, not a second copy; the missing
// predecessor applies and releases it once; a skipped sequence is still
// refused. Nothing applies from scratch. On Postgres, MariaDB and SQLite.
func TestOrderedEntityAfterCleanup(t *testing.T) {
	dialects := retDialects(t)
	if pgDSN != "" {
		dialects = append(dialects, retDialect{name: "postgres", dialect: postgres.New(), open: func(t *testing.T) *sql.DB { return openDB(t) },
			table: func(t *testing.T, db *sql.DB) string { return tempSchema(t, db) + ".claims" }})
	}
	for _, rd := range dialects {
		t.Run(rd.name, func(t *testing.T) {
			ctx := context.Background()
			db := rd.open(t)
			table := rd.table(t, db)
			audit := table + "_audit"
			t.Cleanup(func() {
				for _, s := range []string{audit, table + "_order_seq", table + "_order_parked"} {
					_, _ = db.Exec("DROP TABLE IF EXISTS " + s)
				}
			})
			if _, err := db.Exec("CREATE TABLE " + audit + " (seq INTEGER NOT NULL, pos INTEGER NOT NULL)"); err != nil {
				t.Fatal(err)
			}
			apply := func(ctx context.Context, tx *sql.Tx, seq int64) error {
				_, err := tx.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (seq, pos) SELECT %d, COUNT(*) + 1 FROM %s", audit, seq, audit))
				return err
			}
			clock := testenv.NewClock(time.Time{})
			opts := []idempotent.Option{idempotent.WithTable(table), idempotent.WithRetention(time.Hour), idempotent.WithClock(clock.Now),
				idempotent.WithOrdering(idempotent.Ordering{Release: func(ctx context.Context, tx *sql.Tx, p idempotent.ParkedMessage) error {
					return apply(ctx, tx, p.OrderSeq)
				}})}
			mw, err := idempotent.New(db, rd.dialect, "ledger", opts...)
			if err != nil {
				t.Fatal(err)
			}
			if err := mw.EnsureSchema(ctx); err != nil {
				t.Fatal(err)
			}
			process := func(key string, seq int64) (idempotent.Outcome, error) {
				return mw.ProcessMessage(ctx, idempotent.Message{Key: key, OrderKey: "account:1", OrderSeq: seq, Payload: []byte("{}")},
					func(ctx context.Context, tx *sql.Tx) error { return apply(ctx, tx, seq) })
			}
			count := func(q string) int64 {
				t.Helper()
				var n int64
				if err := db.QueryRow(q).Scan(&n); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
				return n
			}
			want := func(key string, seq int64, want idempotent.Outcome) {
				t.Helper()
				if out, err := process(key, seq); err != nil || out != want {
					t.Fatalf("%s (sequence %d): %v, %v; want %v", key, seq, out, err, want)
				}
			}
			want("e1", 1, idempotent.Applied)
			want("e2", 2, idempotent.Applied)
			want("e3", 3, idempotent.Applied)
			want("e6", 6, idempotent.Parked) // 4 and 5 missing
			if _, err := mw.SkipGap(ctx, "account:1", 4); err != nil {
				t.Fatal(err)
			}
			// Every claim is past the window: Cleanup deletes them all.
			clock.Add(3 * time.Hour)
			n, err := mw.ClaimTable().Cleanup(ctx, idempotent.DefaultCleanupOptions())
			if err != nil || n != 4 {
				t.Fatalf("Cleanup: %d, %v; want the 4 claims deleted", n, err)
			}
			if c := count("SELECT count(*) FROM " + table); c != 0 {
				t.Fatalf("%d claims left", c)
			}
			// The sequence row (last 4), the parked 6 and the tombstone of 4
			// are kept.
			if last := count("SELECT last_seq FROM " + table + "_order_seq"); last != 4 {
				t.Fatalf("sequence row after Cleanup: %d, want 4", last)
			}
			if p := count("SELECT count(*) FROM " + table + "_order_parked"); p != 2 {
				t.Fatalf("%d parking rows after Cleanup, want the parked 6 and the skipped 4", p)
			}
			want("e2", 2, idempotent.Duplicate)        // a dead-letter replay of an applied message
			want("e2-resent", 2, idempotent.Duplicate) // the producer's re-send under a new key
			want("e6", 6, idempotent.Duplicate)        // the parked message's redelivery, claim gone
			if _, err := process("e4", 4); !errors.Is(err, idempotent.ErrSkippedSequence) {
				t.Fatalf("the skipped 4 after Cleanup: %v; want ErrSkippedSequence", err)
			}
			want("e5", 5, idempotent.Applied) // releases 6
			want("e7", 7, idempotent.Applied)
			var got []int64
			rows, err := db.Query("SELECT seq FROM " + audit + " ORDER BY pos")
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var s int64
				if err := rows.Scan(&s); err != nil {
					t.Fatal(err)
				}
				got = append(got, s)
			}
			_ = rows.Close()
			if !slices.Equal(got, []int64{1, 2, 3, 5, 6, 7}) {
				t.Fatalf("effects applied %v; want 1, 2, 3, 5, 6, 7, each once, in order", got)
			}
		})
	}
}
