package rabbitmq_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/postgres"
)

// order is the loyalty service's message: so many points for a customer,
// keyed order-completed:<id>.
type order = testenv.Order

// loyalty is the loyalty service on a schema of the test's own
// (testenv.LoyaltySchema): a claim table, balances and a point ledger.
type loyalty struct {
	db     *sql.DB
	schema string
	mw     *idempotent.Middleware
}

// openDB returns a pool of at most maxConns connections on the test
// Postgres (testenv.OpenPostgres) and fails the test if one is still in
// use when it ends: a consumer whose Run returned holds no connection.
func openDB(t testing.TB, maxConns int) *sql.DB {
	t.Helper()
	db := testenv.OpenPostgres(t, maxConns)
	t.Cleanup(func() { // before the pool closes
		if n := db.Stats().InUse; n != 0 {
			t.Errorf("connection leak: %d connections still in use", n)
		}
	})
	return db
}

// newLoyalty's opts are idempotent's options, after WithTable.
func newLoyalty(t testing.TB, db *sql.DB, opts ...idempotent.Option) *loyalty {
	t.Helper()
	schema := testenv.LoyaltySchema(t, db, "rabbitmq")
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

// partitionedLoyalty is the loyalty service on a day-partitioned claim
// table (lead days created ahead), on a pool of 4 connections, with a
// clock at now.
func partitionedLoyalty(t *testing.T, now time.Time, lead int) (*loyalty, *testenv.Clock) {
	t.Helper()
	clock := testenv.NewClock(now)
	return newLoyalty(t, openDB(t, 4), idempotent.WithDailyPartitions(lead), idempotent.WithClock(clock.Now)), clock
}

// credit is the effect: points on the balance and a ledger row, through tx.
func (l *loyalty) credit(ctx context.Context, tx *sql.Tx, o order) error {
	return testenv.Credit(ctx, tx, l.schema, o)
}

// count runs query, in which $S stands for the schema (testenv.Count).
func (l *loyalty) count(t testing.TB, query string) int64 {
	t.Helper()
	return testenv.Count(t, l.db, l.schema, query)
}

// balance returns the customer's points.
func (l *loyalty) balance(t testing.TB, customer int64) int64 {
	t.Helper()
	return l.count(t, fmt.Sprintf("SELECT points FROM $S.balances WHERE customer_id = %d", customer))
}

// ledgerRows returns how many ledger rows credit the order.
func (l *loyalty) ledgerRows(t testing.TB, orderID int64) int64 {
	t.Helper()
	return l.count(t, fmt.Sprintf("SELECT count(*) FROM $S.point_ledger WHERE order_id = %d", orderID))
}

// partitionOf returns the partition holding the claim for key.
func partitionOf(t testing.TB, l *loyalty, key string) string {
	t.Helper()
	var name string
	err := l.db.QueryRow("SELECT tableoid::regclass::text FROM "+pq.QuoteIdentifier(l.schema)+".processed_messages WHERE message_key = $1", key).Scan(&name)
	if err != nil {
		t.Fatalf("claim %s: %v", key, err)
	}
	return name
}
