package idemsqlx_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idemsqlx"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/postgres"
)

// openPostgres connects to IDEMPOTENT_POSTGRES_DSN, or the local default,
// and gives the test a schema of its own with the loyalty tables. Without a
// database the test skips — or fails when CI is set.
func openPostgres(t *testing.T) (*sqlx.DB, string) {
	t.Helper()
	dsn := testenv.Getenv("IDEMPOTENT_POSTGRES_DSN", testenv.DefaultPostgresDSN)
	db, err := sqlx.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(10)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		testenv.Unavailable(t, "no Postgres at %s (%v): set IDEMPOTENT_POSTGRES_DSN, or run bash scripts/test", dsn, err)
	}
	schema := testenv.UniqueName("idemsqlx")
	q := pq.QuoteIdentifier(schema)
	if _, err := db.Exec(fmt.Sprintf(`
CREATE SCHEMA %[1]s;
CREATE TABLE %[1]s.balances (customer_id bigint PRIMARY KEY, points bigint NOT NULL DEFAULT 0);
CREATE TABLE %[1]s.point_ledger (id bigserial PRIMARY KEY, customer_id bigint NOT NULL, order_id bigint NOT NULL, points bigint NOT NULL);
INSERT INTO %[1]s.balances SELECT g, 0 FROM generate_series(1, 10) g;`, q)); err != nil {
		_ = db.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := db.Exec("DROP SCHEMA " + q + " CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
		if n := db.Stats().InUse; n != 0 {
			t.Errorf("connection leak: %d connections still in use", n)
		}
		_ = db.Close()
	})
	return db, schema
}

// TestPostgresNamedQueries runs the sqlx handler with named queries against
// Postgres: redeliveries and concurrent duplicates credit once.
func TestPostgresNamedQueries(t *testing.T) {
	t.Parallel()
	db, schema := openPostgres(t)
	ctx := context.Background()
	mw, err := idempotent.New(db.DB, postgres.New(), "loyalty", idempotent.WithTable(schema+".processed_messages"))
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	q := pq.QuoteIdentifier(schema)
	handle := idemsqlx.WrapMessage(mw, orderMessage, db, func(ctx context.Context, tx *sqlx.Tx, o orderCompleted) error {
		c := credit{CustomerID: o.CustomerID, OrderID: o.OrderID, Points: o.TotalCents / 100}
		if _, err := tx.NamedExecContext(ctx, "UPDATE "+q+".balances SET points = points + :points WHERE customer_id = :customer_id", c); err != nil {
			return err
		}
		_, err := tx.NamedExecContext(ctx, "INSERT INTO "+q+".point_ledger (customer_id, order_id, points) VALUES (:customer_id, :order_id, :points)", c)
		return err
	})

	first := orderCompleted{OrderID: 9912, CustomerID: 7, TotalCents: 5000}
	for i, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate, idempotent.Duplicate} {
		if got, err := handle(ctx, first); err != nil || got != want {
			t.Fatalf("delivery %d: got (%v, %v), want %v", i+1, got, err, want)
		}
	}

	second := orderCompleted{OrderID: 9913, CustomerID: 8, TotalCents: 1000}
	var wg sync.WaitGroup
	outcomes := make(chan idempotent.Outcome, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := handle(ctx, second)
			if err != nil {
				t.Error(err)
			}
			outcomes <- got
		}()
	}
	wg.Wait()
	close(outcomes)
	counts := map[idempotent.Outcome]int{}
	for o := range outcomes {
		counts[o]++
	}
	if counts[idempotent.Applied] != 1 || counts[idempotent.Duplicate] != 7 {
		t.Fatalf("concurrent deliveries: %v, want 1 applied and 7 duplicates", counts)
	}

	var balances []struct {
		CustomerID int64 `db:"customer_id"`
		Points     int64 `db:"points"`
	}
	if err := db.SelectContext(ctx, &balances, "SELECT customer_id, points FROM "+q+".balances WHERE points <> 0 ORDER BY customer_id"); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(balances) != "[{7 50} {8 10}]" {
		t.Fatalf("balances %v, want [{7 50} {8 10}]", balances)
	}
	var ledger int
	if err := db.GetContext(ctx, &ledger, "SELECT count(*) FROM "+q+".point_ledger"); err != nil {
		t.Fatal(err)
	}
	if ledger != 2 {
		t.Fatalf("%d ledger rows, want 2", ledger)
	}
}

// TestPostgresTxOptions checks the Middleware's isolation level reaches the
// transaction sqlx begins, and Get works inside the handler.
func TestPostgresTxOptions(t *testing.T) {
	t.Parallel()
	db, schema := openPostgres(t)
	ctx := context.Background()
	mw, err := idempotent.New(db.DB, postgres.New(), "loyalty",
		idempotent.WithTable(schema+".processed_messages"),
		idempotent.WithTxOptions(sql.TxOptions{Isolation: sql.LevelSerializable}))
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	var level string
	got, err := idemsqlx.ProcessMessage(ctx, mw, idempotent.Message{Key: "k"}, db, func(ctx context.Context, tx *sqlx.Tx) error {
		return tx.GetContext(ctx, &level, "SHOW transaction_isolation")
	})
	if err != nil || got != idempotent.Applied {
		t.Fatalf("got (%v, %v), want applied", got, err)
	}
	if level != "serializable" {
		t.Fatalf("isolation %q, want serializable", level)
	}
}

// TestPostgresProcessMessages claims a batch in one transaction through
// sqlx: the new messages' effects are applied with a named batch insert,
// and a redelivery of the batch applies nothing.
func TestPostgresProcessMessages(t *testing.T) {
	t.Parallel()
	db, schema := openPostgres(t)
	ctx := context.Background()
	mw, err := idempotent.New(db.DB, postgres.New(), "loyalty", idempotent.WithTable(schema+".processed_messages"))
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	q := pq.QuoteIdentifier(schema)
	orders := []orderCompleted{{OrderID: 1, CustomerID: 1, TotalCents: 1000}, {OrderID: 2, CustomerID: 2, TotalCents: 2000}, {OrderID: 1, CustomerID: 1, TotalCents: 1000}}
	msgs := make([]idempotent.Message, len(orders))
	for i, o := range orders {
		m, err := orderMessage(o)
		if err != nil {
			t.Fatal(err)
		}
		m.EventTime = time.Now()
		msgs[i] = m
	}
	apply := func(ctx context.Context, tx *sqlx.Tx, fresh []int) error {
		credits := make([]credit, len(fresh))
		for j, i := range fresh {
			o := orders[i]
			credits[j] = credit{CustomerID: o.CustomerID, OrderID: o.OrderID, Points: o.TotalCents / 100}
		}
		_, err := tx.NamedExecContext(ctx, "INSERT INTO "+q+".point_ledger (customer_id, order_id, points) VALUES (:customer_id, :order_id, :points)", credits)
		return err
	}
	want := []idempotent.Outcome{idempotent.Applied, idempotent.Applied, idempotent.Duplicate}
	if outs, err := idemsqlx.ProcessMessages(ctx, mw, msgs, db, apply); err != nil || fmt.Sprint(outs) != fmt.Sprint(want) {
		t.Fatalf("first delivery: (%v, %v), want %v", outs, err, want)
	}
	if outs, err := idemsqlx.ProcessMessages(ctx, mw, msgs, db, apply); err != nil || slices.Contains(outs, idempotent.Applied) {
		t.Fatalf("redelivery: (%v, %v), want all duplicates", outs, err)
	}
	var ledger int
	if err := db.GetContext(ctx, &ledger, "SELECT count(*) FROM "+q+".point_ledger"); err != nil || ledger != 2 {
		t.Fatalf("%d ledger rows (%v), want 2", ledger, err)
	}
	// A *sqlx.DB over another *sql.DB would claim and apply in two
	// transactions: refused before anything is sent.
	other := sqlx.NewDb(&sql.DB{}, "postgres")
	if _, err := idemsqlx.ProcessMessages(ctx, mw, msgs[:1], other, apply); !errors.Is(err, idemsqlx.ErrOtherDB) {
		t.Fatalf("another database: %v, want ErrOtherDB", err)
	}
}
