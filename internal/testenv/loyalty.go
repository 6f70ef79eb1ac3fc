package testenv

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"testing"

	"github.com/lib/pq"
)

// Order is the loyalty service's message, as the adapters' tests publish
// it: so many points for a customer.
type Order struct {
	OrderID    int64 `json:"order_id"`
	CustomerID int64 `json:"customer_id"`
	Points     int64 `json:"points"`
}

// Key is the order's message key.
func (o Order) Key() string { return fmt.Sprintf("order-completed:%d", o.OrderID) }

// MakeOrders returns n orders with ids from 1, spread over 97 customers.
func MakeOrders(n int) []Order {
	orders := make([]Order, n)
	for i := range orders {
		id := int64(i + 1)
		orders[i] = Order{OrderID: id, CustomerID: 1 + id%97, Points: 1 + id%37}
	}
	return orders
}

// LoyaltySchema creates a schema of the test's own, named from prefix, with
// the loyalty tables (balances for customers 1 to 100, and point_ledger,
// one row per applied order), dropped in Cleanup. The claim table is the
// caller's: processed_messages in the schema is what AuditLedger reads.
func LoyaltySchema(t testing.TB, db *sql.DB, prefix string) string {
	t.Helper()
	schema := UniqueName(prefix)
	q := pq.QuoteIdentifier(schema)
	if _, err := db.Exec(fmt.Sprintf(`CREATE SCHEMA %[1]s;
CREATE TABLE %[1]s.balances (customer_id bigint PRIMARY KEY, points bigint NOT NULL DEFAULT 0);
CREATE TABLE %[1]s.point_ledger (order_id bigint NOT NULL, customer_id bigint NOT NULL, points bigint NOT NULL);
INSERT INTO %[1]s.balances SELECT g, 0 FROM generate_series(1, 100) g;`, q)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := db.Exec("DROP SCHEMA " + q + " CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// Credit is the loyalty effect of o, through tx: points on the customer's
// balance and a ledger row.
func Credit(ctx context.Context, tx *sql.Tx, schema string, o Order) error {
	q := pq.QuoteIdentifier(schema)
	if _, err := tx.ExecContext(ctx, "UPDATE "+q+".balances SET points = points + $1 WHERE customer_id = $2", o.Points, o.CustomerID); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, "INSERT INTO "+q+".point_ledger (order_id, customer_id, points) VALUES ($1, $2, $3)", o.OrderID, o.CustomerID, o.Points)
	return err
}

// CreditBatch is Credit for several orders, set-wise, as a batch handler
// applies them: one UPDATE of the balances, summed per customer, and one
// INSERT of the ledger rows. The balances are locked first in ascending
// customer order, so that concurrent batches cannot deadlock.
func CreditBatch(ctx context.Context, tx *sql.Tx, schema string, orders []Order) error {
	sums := map[int64]int64{}
	var ids, custs, points []int64
	for _, o := range orders {
		sums[o.CustomerID] += o.Points
		ids, custs, points = append(ids, o.OrderID), append(custs, o.CustomerID), append(points, o.Points)
	}
	cs := make([]int64, 0, len(sums))
	for c := range sums {
		cs = append(cs, c)
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i] < cs[j] })
	ps := make([]int64, len(cs))
	for i, c := range cs {
		ps[i] = sums[c]
	}
	q := pq.QuoteIdentifier(schema)
	if _, err := tx.ExecContext(ctx, "SELECT 1 FROM "+q+".balances WHERE customer_id = ANY($1) ORDER BY customer_id FOR UPDATE", pq.Array(cs)); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "UPDATE "+q+".balances b SET points = b.points + u.p FROM unnest($1::bigint[], $2::bigint[]) AS u(c, p) WHERE b.customer_id = u.c",
		pq.Array(cs), pq.Array(ps)); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, "INSERT INTO "+q+".point_ledger (order_id, customer_id, points) SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[])",
		pq.Array(ids), pq.Array(custs), pq.Array(points))
	return err
}

// AuditOrders is AuditLedger for exactly orders applied once each.
func AuditOrders(t testing.TB, db *sql.DB, schema string, orders []Order) {
	t.Helper()
	want := map[int64]int64{}
	for _, o := range orders {
		want[o.CustomerID] += o.Points
	}
	AuditLedger(t, db, schema, len(orders), want)
}
