package testenv

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent/outbox"
)

// Count runs query, a SELECT of one integer in which $S stands for the
// quoted schema, and returns its result.
func Count(t testing.TB, db *sql.DB, schema, query string) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(strings.ReplaceAll(query, "$S", pq.QuoteIdentifier(schema))).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// AuditLedger checks the loyalty tables of schema (point_ledger, one row
// per applied order; processed_messages, the claims; balances) against the
// orders meant to be applied: orders ledger rows and claims, no order
// applied twice, and every customer's balance equal to want[customer] (0
// for a customer want does not name).
func AuditLedger(t testing.TB, db *sql.DB, schema string, orders int, want map[int64]int64) {
	t.Helper()
	if n := Count(t, db, schema, "SELECT count(*) FROM $S.point_ledger"); n != int64(orders) {
		t.Errorf("%d ledger rows, want %d", n, orders)
	}
	if n := Count(t, db, schema, "SELECT count(*) FROM (SELECT order_id FROM $S.point_ledger GROUP BY order_id HAVING count(*) > 1) d"); n != 0 {
		t.Errorf("%d orders applied more than once", n)
	}
	if n := Count(t, db, schema, "SELECT count(*) FROM $S.processed_messages"); n != int64(orders) {
		t.Errorf("%d claims, want %d", n, orders)
	}
	rows, err := db.Query("SELECT customer_id, points FROM " + pq.QuoteIdentifier(schema) + ".balances")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[int64]int64{}
	for rows.Next() {
		var c, p int64
		if err := rows.Scan(&c, &p); err != nil {
			t.Fatal(err)
		}
		got[c] = p
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	wrong := 0
	check := func(c int64) {
		if got[c] != want[c] {
			if wrong++; wrong <= 5 {
				t.Errorf("customer %d has %d points, want %d", c, got[c], want[c])
			}
		}
	}
	for c := range got {
		check(c)
	}
	for c := range want {
		if _, ok := got[c]; !ok {
			check(c)
		}
	}
	if wrong > 0 {
		t.Errorf("%d balances wrong", wrong)
	}
}

// ClaimDays returns the event days (2006-01-02, ascending) of the claims
// of key in the claim table processed_messages of schema, partitioned by
// event day, on Postgres.
func ClaimDays(t testing.TB, db *sql.DB, schema, key string) []string {
	t.Helper()
	rows, err := db.Query("SELECT to_char(event_day, 'YYYY-MM-DD') FROM "+pq.QuoteIdentifier(schema)+".processed_messages WHERE message_key = $1 ORDER BY event_day", key)
	if err != nil {
		t.Fatalf("claim days of %s: %v", key, err)
	}
	defer rows.Close()
	var days []string
	for rows.Next() {
		var d string
		if err := rows.Scan(&d); err != nil {
			t.Fatal(err)
		}
		days = append(days, d)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return days
}

// Outbox returns consumer's outbox on the table outbox of schema, without
// notifications, created.
func Outbox(t testing.TB, db *sql.DB, schema, consumer string) *outbox.Outbox {
	t.Helper()
	ob, err := outbox.New(db, consumer, outbox.WithTable(schema+".outbox"), outbox.WithoutNotify())
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return ob
}
