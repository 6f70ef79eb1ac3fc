package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/postgres"
)

// The guide's Step 4: the ledger's unique order_id is the idempotency record,
// and the balance update runs only if the ledger insert happened.
func TestProcessNaturalKeyAppliesOnce(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	l := newLoyalty(t, db)
	q := pq.QuoteIdentifier(l.schema)
	if _, err := db.Exec("ALTER TABLE " + q + ".point_ledger ADD CONSTRAINT one_credit_per_order UNIQUE (order_id)"); err != nil {
		t.Fatal(err)
	}
	credit := `WITH credit AS (
  INSERT INTO ` + q + `.point_ledger (customer_id, order_id, points) VALUES ($1, $2, $3)
  ON CONFLICT (order_id) DO NOTHING
  RETURNING customer_id, points
)
UPDATE ` + q + `.balances b SET points = b.points + c.points FROM credit c WHERE b.customer_id = c.customer_id`
	msg := orderCompleted{OrderID: 42, CustomerID: 9, TotalCents: 4200}
	handle := func() (idempotent.Outcome, error) {
		return l.mw.ProcessNatural(context.Background(), idempotent.Message{Key: msg.key()}, func(ctx context.Context, tx *sql.Tx) (bool, error) {
			res, err := tx.ExecContext(ctx, credit, msg.CustomerID, msg.OrderID, pointsFor(msg))
			if err != nil {
				return false, err
			}
			n, err := res.RowsAffected()
			return n == 1, err
		})
	}
	var wg sync.WaitGroup
	counts := map[idempotent.Outcome]int{}
	var mu sync.Mutex
	for range 8 {
		wg.Go(func() {
			o, err := handle()
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			counts[o]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if counts[idempotent.Applied] != 1 || counts[idempotent.Duplicate] != 7 {
		t.Fatalf("outcomes %v, want 1 applied and 7 duplicate", counts)
	}
	if b := l.balance(t, 9); b != pointsFor(msg) {
		t.Fatalf("balance %d, want %d", b, pointsFor(msg))
	}
	// No claim was written: the ledger is the record.
	var claims int
	if err := db.QueryRow("SELECT count(*) FROM " + q + ".processed_messages").Scan(&claims); err != nil {
		t.Fatal(err)
	}
	if claims != 0 {
		t.Fatalf("%d claim rows, want 0", claims)
	}
}

// A projection of order status by version: versions delivered out of order
// and repeated leave the newest state, and each delivery is reported applied
// or stale.
func TestVersionedUpsertOutOfOrder(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	schema := tempSchema(t, db)
	table := schema + ".order_status"
	if _, err := db.Exec("CREATE TABLE " + pq.QuoteIdentifier(schema) + ".order_status (order_id bigint PRIMARY KEY, version bigint NOT NULL, status text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	up, err := dialect.NewVersionedUpsert(postgres.New(), dialect.VersionedUpsert{
		Table: table, Key: []string{"order_id"}, Version: "version", Columns: []string{"status"},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	deliveries := []struct {
		version int64
		applied bool
	}{{3, true}, {1, false}, {2, false}, {3, false}, {5, true}, {4, false}, {5, false}}
	for _, d := range deliveries {
		err := idempotent.RunTx(ctx, db, postgres.New(), nil, idempotent.DefaultRetryPolicy(), func(ctx context.Context, tx *sql.Tx) error {
			applied, err := up.Exec(ctx, tx, 7, d.version, fmt.Sprintf("v%d", d.version))
			if err == nil && applied != d.applied {
				err = fmt.Errorf("version %d: applied %v, want %v", d.version, applied, d.applied)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	var version int64
	var status string
	if err := db.QueryRow("SELECT version, status FROM "+pq.QuoteIdentifier(schema)+".order_status WHERE order_id = 7").Scan(&version, &status); err != nil {
		t.Fatal(err)
	}
	if version != 5 || status != "v5" {
		t.Fatalf("row is (%d, %q), want (5, \"v5\")", version, status)
	}
}

func TestVersionedUpsertRejectsBadInput(t *testing.T) {
	t.Parallel()
	d := postgres.New()
	for _, tc := range []struct {
		name string
		u    dialect.VersionedUpsert
		want string
	}{
		{"bad table", dialect.VersionedUpsert{Table: "t; DROP TABLE x", Key: []string{"id"}, Version: "v"}, "table name"},
		{"no key", dialect.VersionedUpsert{Table: "t", Version: "v"}, "no key columns"},
		{"bad column", dialect.VersionedUpsert{Table: "t", Key: []string{"id"}, Version: "v", Columns: []string{`a"b`}}, "column"},
		{"empty version", dialect.VersionedUpsert{Table: "t", Key: []string{"id"}}, "column"},
		{"repeated column", dialect.VersionedUpsert{Table: "t", Key: []string{"id"}, Version: "id"}, "listed twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dialect.NewVersionedUpsert(d, tc.u)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
			if tc.name == "bad column" && !errors.Is(err, dialect.ErrInvalidIdentifier) {
				t.Fatalf("%v does not match dialect.ErrInvalidIdentifier", err)
			}
		})
	}
	up, err := dialect.NewVersionedUpsert(d, dialect.VersionedUpsert{Table: "t", Key: []string{"id"}, Version: "v", Columns: []string{"s"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := up.Exec(context.Background(), failingExecer{t}, 1, 2); err == nil || !strings.Contains(err.Error(), "2 values, want 3") {
		t.Fatalf("wrong value count: got %v", err)
	}
}

// failingExecer fails the test if a statement reaches it.
type failingExecer struct{ t *testing.T }

func (f failingExecer) ExecContext(context.Context, string, ...any) (sql.Result, error) {
	f.t.Fatal("statement sent despite bad input")
	return nil, nil
}

// WithStrictGuard covers ProcessNatural too: on a database opened without
// GuardConnector (so nothing refuses the statement), an explicit COMMIT in
// the handler ends the transaction, and the check before commit reports it.
func TestProcessNaturalStrictGuard(t *testing.T) {
	t.Parallel()
	if pgDSN == "" {
		t.Skip(skipReason)
	}
	db := sql.OpenDB(connector(t, "pgx", pgDSN))
	db.SetMaxOpenConns(2)
	t.Cleanup(func() { closeChecked(t, db) })
	l := newLoyalty(t, db, idempotent.WithStrictGuard())
	msg := orderCompleted{OrderID: 77, CustomerID: 3, TotalCents: 700}
	_, err := l.mw.ProcessNatural(context.Background(), idempotent.Message{Key: msg.key()}, func(ctx context.Context, tx *sql.Tx) (bool, error) {
		if err := l.credit(ctx, tx, msg); err != nil {
			return false, err
		}
		_, err := tx.ExecContext(ctx, "COMMIT")
		return true, err
	})
	if !errors.Is(err, idempotent.ErrAutocommit) {
		t.Fatalf("ProcessNatural with an explicit COMMIT under the strict guard: %v, want ErrAutocommit", err)
	}
	// An ordinary natural-key delivery passes the guard.
	got, err := l.mw.ProcessNatural(context.Background(), idempotent.Message{Key: "order-completed:78"}, func(ctx context.Context, tx *sql.Tx) (bool, error) {
		return true, l.credit(ctx, tx, orderCompleted{OrderID: 78, CustomerID: 4, TotalCents: 100})
	})
	if err != nil || got != idempotent.Applied {
		t.Fatalf("ordinary delivery under the strict guard: (%v, %v), want applied", got, err)
	}
}
