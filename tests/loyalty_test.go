package tests

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
)

// loyalty is the guide's loyalty service on a schema of the test's own: a
// claim table, balances and a point ledger.
type loyalty struct {
	db     *sql.DB
	schema string
	mw     *idempotent.Middleware
}

// orderCompleted is the guide's OrderCompleted event.
type orderCompleted struct {
	OrderID    int64
	CustomerID int64
	TotalCents int64
}

func (o orderCompleted) key() string { return fmt.Sprintf("order-completed:%d", o.OrderID) }

func pointsFor(o orderCompleted) int64 { return o.TotalCents / 100 }

func newLoyalty(t testing.TB, db *sql.DB, opts ...idempotent.Option) *loyalty {
	t.Helper()
	schema := tempSchema(t, db)
	q := pq.QuoteIdentifier(schema)
	if _, err := db.Exec(fmt.Sprintf(`
CREATE TABLE %[1]s.balances (customer_id bigint PRIMARY KEY, points bigint NOT NULL DEFAULT 0);
CREATE TABLE %[1]s.point_ledger (id bigserial PRIMARY KEY, customer_id bigint NOT NULL, order_id bigint NOT NULL, points bigint NOT NULL);
INSERT INTO %[1]s.balances SELECT g, 0 FROM generate_series(1, 100) g;`, q)); err != nil {
		t.Fatal(err)
	}
	opts = append([]idempotent.Option{idempotent.WithTable(schema + ".processed_messages")}, opts...)
	mw, err := idempotent.New(db, postgres.New(), "loyalty", opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &loyalty{db: db, schema: schema, mw: mw}
}

// credit is the guide's effect: add points to the balance and write a ledger
// row, both through tx.
func (l *loyalty) credit(ctx context.Context, tx *sql.Tx, o orderCompleted) error {
	q := pq.QuoteIdentifier(l.schema)
	if _, err := tx.ExecContext(ctx, "UPDATE "+q+".balances SET points = points + $1 WHERE customer_id = $2", pointsFor(o), o.CustomerID); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, "INSERT INTO "+q+".point_ledger (customer_id, order_id, points) VALUES ($1, $2, $3)", o.CustomerID, o.OrderID, pointsFor(o))
	return err
}

func (l *loyalty) handle(ctx context.Context, o orderCompleted) (idempotent.Outcome, error) {
	return l.mw.ProcessMessage(ctx, idempotent.Message{Key: o.key()}, func(ctx context.Context, tx *sql.Tx) error { return l.credit(ctx, tx, o) })
}

func (l *loyalty) balance(t testing.TB, customer int64) int64 {
	t.Helper()
	var p int64
	if err := l.db.QueryRow("SELECT points FROM "+pq.QuoteIdentifier(l.schema)+".balances WHERE customer_id = $1", customer).Scan(&p); err != nil {
		t.Fatal(err)
	}
	return p
}

func (l *loyalty) ledgerRows(t testing.TB, order int64) int {
	t.Helper()
	var n int
	if err := l.db.QueryRow("SELECT count(*) FROM "+pq.QuoteIdentifier(l.schema)+".point_ledger WHERE order_id = $1", order).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestRedeliveryAppliesOnce(t *testing.T) {
	t.Parallel()
	l := newLoyalty(t, openDB(t))
	msg := orderCompleted{OrderID: 9912, CustomerID: 7, TotalCents: 5000}
	ctx := context.Background()
	for i, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate, idempotent.Duplicate} {
		got, err := l.handle(ctx, msg)
		if err != nil || got != want {
			t.Fatalf("delivery %d: got (%v, %v), want %v", i+1, got, err, want)
		}
	}
	if b := l.balance(t, 7); b != pointsFor(msg) {
		t.Fatalf("balance %d, want %d", b, pointsFor(msg))
	}
	if n := l.ledgerRows(t, 9912); n != 1 {
		t.Fatalf("%d ledger rows, want 1", n)
	}
}
