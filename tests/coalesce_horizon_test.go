package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/mysql"
)

// TestCoalescedHorizonMariaDB: on MariaDB a coalesced group claims its
// members one at a time (savepoints, and the optimistic design's
// fallback). While the handler of an earlier member runs, a cleanup with a
// shorter window (7 days, where the Middleware's is 30) raises the table's
// horizon and deletes the claim of a 20-day-old message whose replay is a
// later member of the group. The replay must
// not be applied a second time, at REPEATABLE READ (MariaDB's default,
// where the transaction's earlier reads took its snapshot) and at READ
// COMMITTED, in both designs: the horizon read after its claim sees the
// horizon as it stands, or the cleanup waits for the group.
func TestCoalescedHorizonMariaDB(t *testing.T) {
	dsn := mysqlDSN(t)
	open := func() *sql.DB {
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(6)
		t.Cleanup(func() { closeChecked(t, db) })
		return db
	}
	for _, iso := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelReadCommitted} {
		for _, savepoints := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/savepoints=%v", iso, savepoints), func(t *testing.T) {
				db, mon := open(), open()
				ctx := context.Background()
				table, audit := uniqueName("hz"), uniqueName("hzaudit")
				t.Cleanup(func() {
					for _, s := range []string{table, mysql.HorizonName(table), audit} {
						_, _ = mon.Exec("DROP TABLE IF EXISTS " + s)
					}
				})
				if _, err := db.Exec("CREATE TABLE " + audit + " (k VARCHAR(200) NOT NULL) ENGINE=InnoDB"); err != nil {
					t.Fatal(err)
				}
				opts := []idempotent.Option{idempotent.WithTable(table),
					idempotent.WithRetention(30 * day), idempotent.WithTxOptions(sql.TxOptions{Isolation: iso})}
				single, err := idempotent.New(db, mysql.New(), "hz", opts...)
				if err != nil {
					t.Fatal(err)
				}
				if err := single.EnsureSchema(ctx); err != nil {
					t.Fatal(err)
				}
				group, err := idempotent.New(db, mysql.New(), "hz", append(opts,
					idempotent.WithCoalescing(idempotent.Coalescing{Max: 2, Wait: time.Second, Savepoints: savepoints}))...)
				if err != nil {
					t.Fatal(err)
				}
				apply := func(k string) idempotent.TxFunc {
					return func(ctx context.Context, tx *sql.Tx) error {
						_, err := tx.ExecContext(ctx, "INSERT INTO "+audit+" (k) VALUES (?)", k)
						return err
					}
				}
				effects := func(k string) int { return count(t, mon, "SELECT COUNT(*) FROM "+audit+" WHERE k = ?", k) }

				// The old message, of twenty days ago, was applied then.
				old := idempotent.Message{Key: "z-old", EventTime: time.Now().Add(-20 * day)}
				if out, err := single.ProcessMessage(ctx, old, apply(old.Key)); err != nil || out != idempotent.Applied {
					t.Fatalf("first delivery of the old message: %v, %v", out, err)
				}
				// A claim of yesterday, which the cleanup keeps: its scan
				// of the processed_at index ends there, short of the
				// group's uncommitted claims.
				mid := idempotent.Message{Key: "m-mid", EventTime: time.Now().Add(-day)}
				if out, err := single.ProcessMessage(ctx, mid, apply(mid.Key)); err != nil || out != idempotent.Applied {
					t.Fatalf("a message of yesterday: %v, %v", out, err)
				}
				for _, m := range []idempotent.Message{old, mid} {
					if _, err := mon.Exec("UPDATE "+table+" SET processed_at = ? WHERE message_key = ?", m.EventTime.UTC(), m.Key); err != nil {
						t.Fatal(err)
					}
				}
				short, err := idempotent.NewClaimTable(mon, mysql.New(), idempotent.WithTable(table), idempotent.WithRetention(7*day))
				if err != nil {
					t.Fatal(err)
				}

				// A group of a new message, first in key order, and the old
				// message's replay; the 7-day cleanup runs while the new
				// message's handler does, and either finishes or waits for
				// the group's transaction.
				cleaned := make(chan error, 1)
				waiting := func() (bool, error) {
					select {
					case err := <-cleaned:
						cleaned <- err
						return true, nil
					default:
					}
					// The cleanup is at one of its statements, and the
					// group holds a lock that statement needs: a probe of
					// it that does not wait fails (1205). Raising the
					// horizon needs the horizon table's gap the group's
					// horizon reads locked; deleting z-old's claim needs
					// the claim, if the group claimed it.
					for _, stage := range []struct{ stmt, probe string }{
						{"INSERT INTO `" + mysql.HorizonName(table) + "`%",
							"INSERT INTO `" + mysql.HorizonName(table) + "` (consumer, forgotten_before) VALUES ('probe', UTC_TIMESTAMP(6))"},
						{"%DELETE c FROM `" + table + "`%",
							"SELECT 1 FROM `" + table + "` WHERE consumer = 'hz' AND message_key = 'z-old' FOR UPDATE"},
					} {
						var n int
						if err := mon.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE ?", stage.stmt).Scan(&n); err != nil || n == 0 {
							if err != nil {
								return false, err
							}
							continue
						}
						if blocked, err := lockedFor(mon, stage.probe); blocked || err != nil {
							return blocked, err
						}
					}
					return false, nil
				}
				fresh := idempotent.Message{Key: "a-new", EventTime: time.Now()}
				type result struct {
					k   string
					out idempotent.Outcome
					err error
				}
				results := make(chan result, 2)
				go func() {
					out, err := group.ProcessMessage(ctx, fresh, func(ctx context.Context, tx *sql.Tx) error {
						if err := apply(fresh.Key)(ctx, tx); err != nil {
							return err
						}
						go func() {
							_, err := short.Cleanup(context.Background(), idempotent.DefaultCleanupOptions())
							cleaned <- err
						}()
						waitFor(t, "the cleanup to finish or wait for the group", waiting)
						return nil
					})
					results <- result{fresh.Key, out, err}
				}()
				go func() {
					out, err := group.ProcessMessage(ctx, old, apply(old.Key))
					results <- result{old.Key, out, err}
				}()
				outs := map[string]result{}
				for range 2 {
					r := <-results
					outs[r.k] = r
				}
				if err := <-cleaned; err != nil {
					t.Fatalf("cleanup: %v", err)
				}
				if r := outs[fresh.Key]; r.err != nil || r.out != idempotent.Applied {
					t.Errorf("the new message: %v, %v; want applied", r.out, r.err)
				}
				r := outs[old.Key]
				if r.err != nil && !errors.Is(r.err, idempotent.ErrBeyondRetention) {
					t.Errorf("the old message's replay: %v", r.err)
				}
				if n := effects(old.Key); n != 1 {
					t.Errorf("the old message's replay was %v (%v): its effect applied %d times, want once", r.out, r.err, n)
				}
				t.Logf("the replay: %v, %v", r.out, r.err)
			})
		}
	}
}

// lockedFor reports whether stmt, run on db in a transaction of its own
// that is rolled back, cannot get its locks without waiting (MariaDB's
// innodb_lock_wait_timeout 0: error 1205 at once).
func lockedFor(db *sql.DB, stmt string) (bool, error) {
	tx, err := db.Begin()
	if err != nil {
		return false, err
	}
	defer tx.Rollback() //nolint:errcheck
	_, err = tx.Exec("SET STATEMENT innodb_lock_wait_timeout = 0 FOR " + stmt)
	var me *gomysql.MySQLError
	if errors.As(err, &me) && me.Number == 1205 {
		return true, nil
	}
	return false, err
}
