package tests

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
)

// createRole creates a login role with a fresh name and password, dropped
// (with every privilege granted to it and every object it owns) in
// Cleanup. It returns the name and the password.
func createRole(t *testing.T, db *sql.DB, prefix string) (string, string) {
	t.Helper()
	name := uniqueName(prefix)
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	pw := hex.EncodeToString(b)
	if _, err := db.Exec(fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", pq.QuoteIdentifier(name), pw)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		q := pq.QuoteIdentifier(name)
		if _, err := db.Exec("DROP OWNED BY " + q + " CASCADE"); err != nil {
			t.Errorf("drop owned by %s: %v", name, err)
		}
		if _, err := db.Exec("DROP ROLE " + q); err != nil {
			t.Errorf("drop role %s: %v", name, err)
		}
	})
	return name, pw
}

// openAs opens the test database as another role, closed (and checked for
// leaks) in Cleanup.
func openAs(t *testing.T, role, password string) *sql.DB {
	t.Helper()
	dsn := pgDSN
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.User = url.UserPassword(role, password)
		dsn = u.String()
	} else {
		dsn += fmt.Sprintf(" user=%s password=%s", role, password)
	}
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(2)
	t.Cleanup(func() { closeChecked(t, db) })
	if err := db.Ping(); err != nil {
		t.Fatalf("connect as %s: %v", role, err)
	}
	return db
}

// isDenied reports whether err is Postgres's insufficient_privilege.
func isDenied(err error) bool {
	var pe *pq.Error
	return errors.As(err, &pe) && pe.Code == "42501"
}

// TestLeastPrivilege runs the loyalty consumer as a role granted only what
// the README lists, and claim cleanup as a role with SELECT and DELETE on
// the claim table only:
//
//	owner    USAGE, CREATE on the schema; owns the tables; runs EnsureSchema
//	consumer USAGE on the schema; INSERT on the claim table (ON CONFLICT
//	         DO NOTHING without a conflict target needs no SELECT); its own
//	         tables: SELECT, UPDATE on balances, INSERT on point_ledger and
//	         USAGE on its id sequence
//	cleanup  USAGE on the schema; SELECT, DELETE on the claim table
//
// It also shows that each grant is needed (the consumer without INSERT on
// the claim table fails with 42501 and writes nothing) and that nothing
// more is given (the consumer can neither create the claim table nor delete
// claims; the cleanup role cannot insert claims).
func TestLeastPrivilege(t *testing.T) {
	t.Parallel()
	admin := openDB(t)
	admin.SetMaxOpenConns(2)
	schema := tempSchema(t, admin)
	owner, ownerPW := createRole(t, admin, "idem_owner")
	consumer, consumerPW := createRole(t, admin, "idem_consumer")
	cleaner, cleanerPW := createRole(t, admin, "idem_cleanup")
	s := pq.QuoteIdentifier(schema)
	qo, qc, qd := pq.QuoteIdentifier(owner), pq.QuoteIdentifier(consumer), pq.QuoteIdentifier(cleaner)
	mustExec(t, admin, fmt.Sprintf("GRANT USAGE, CREATE ON SCHEMA %s TO %s", s, qo))
	mustExec(t, admin, fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s, %s", s, qc, qd))

	ctx := context.Background()
	table := schema + ".processed_messages"
	claims := s + ".processed_messages"

	// The owner (the migration) creates every table and grants.
	ownerDB := openAs(t, owner, ownerPW)
	mustExec(t, ownerDB, fmt.Sprintf(`
CREATE TABLE %[1]s.balances (customer_id bigint PRIMARY KEY, points bigint NOT NULL DEFAULT 0);
CREATE TABLE %[1]s.point_ledger (id bigserial PRIMARY KEY, customer_id bigint NOT NULL, order_id bigint NOT NULL, points bigint NOT NULL);
INSERT INTO %[1]s.balances VALUES (7, 0);`, s))
	ownerMW, err := idempotent.New(ownerDB, postgres.New(), "loyalty", idempotent.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if err := ownerMW.EnsureSchema(ctx); err != nil {
		t.Fatalf("EnsureSchema as the owner: %v", err)
	}
	mustExec(t, ownerDB, fmt.Sprintf(`
GRANT INSERT ON %[1]s TO %[3]s;
GRANT SELECT ON %[1]s_horizon TO %[3]s;
GRANT SELECT, UPDATE ON %[2]s.balances TO %[3]s;
GRANT INSERT ON %[2]s.point_ledger TO %[3]s;
GRANT USAGE ON SEQUENCE %[2]s.point_ledger_id_seq TO %[3]s;
GRANT SELECT, DELETE ON %[1]s TO %[4]s;
GRANT SELECT, INSERT, UPDATE ON %[1]s_horizon TO %[4]s;`, claims, s, qc, qd))

	// The consumer applies, then sees duplicates, under both isolation
	// levels and with the lock timeout and strict guard, which need no
	// privilege of their own.
	consumerDB := openAs(t, consumer, consumerPW)
	credit := func(order int64) idempotent.TxFunc {
		return func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, "UPDATE "+s+".balances SET points = points + 10 WHERE customer_id = 7"); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, "INSERT INTO "+s+".point_ledger (customer_id, order_id, points) VALUES (7, $1, 10)", order)
			return err
		}
	}
	var order int64
	for _, iso := range []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelSerializable} {
		mw, err := idempotent.New(consumerDB, postgres.New(), "loyalty", idempotent.WithTable(table),
			idempotent.WithTxOptions(sql.TxOptions{Isolation: iso}), idempotent.WithLockTimeout(time.Second),
			idempotent.WithStrictGuard())
		if err != nil {
			t.Fatal(err)
		}
		order++
		key := fmt.Sprintf("order-completed:%d", order)
		for i, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
			got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, credit(order))
			if err != nil || got != want {
				t.Fatalf("%v, delivery %d as the consumer role: (%v, %v), want %v", iso, i+1, got, err, want)
			}
		}
		// The schema is complete: EnsureSchema reads the catalog and sends
		// no DDL, so the consumer role may run it on every start without
		// the right to create anything.
		if err := mw.EnsureSchema(ctx); err != nil {
			t.Fatalf("EnsureSchema as the consumer role, with the schema complete: %v, want nil (it sends no DDL)", err)
		}
	}
	var points, ledger int64
	if err := admin.QueryRow("SELECT (SELECT points FROM "+s+".balances WHERE customer_id = 7), (SELECT count(*) FROM "+s+".point_ledger)").Scan(&points, &ledger); err != nil {
		t.Fatal(err)
	}
	if points != 10*order || ledger != order {
		t.Fatalf("after %d orders: %d points and %d ledger rows, want %d and %d", order, points, ledger, 10*order, order)
	}
	if _, err := consumerDB.Exec("DELETE FROM " + claims); !isDenied(err) {
		t.Fatalf("DELETE of claims as the consumer role: %v, want permission denied", err)
	}

	// Without INSERT on the claim table the consumer gets 42501, its
	// handler never runs, and nothing is written.
	mustExec(t, ownerDB, fmt.Sprintf("REVOKE INSERT ON %s FROM %s", claims, qc))
	mw, err := idempotent.New(consumerDB, postgres.New(), "loyalty", idempotent.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	if _, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "order-completed:99"}, func(context.Context, *sql.Tx) error { ran = true; return nil }); !isDenied(err) || ran {
		t.Fatalf("Process without INSERT on the claim table: %v (handler ran: %v), want permission denied and no handler", err, ran)
	}
	mustExec(t, ownerDB, fmt.Sprintf("GRANT INSERT ON %s TO %s", claims, qc))

	// Cleanup: the middleware's batched Cleanup of claims older than the
	// retention window, as the cleanup role.
	mustExec(t, admin, "UPDATE "+claims+" SET processed_at = now() - interval '40 days' WHERE message_key = 'order-completed:1'")
	cleanDB := openAs(t, cleaner, cleanerPW)
	cleanMW, err := idempotent.New(cleanDB, postgres.New(), "loyalty", idempotent.WithTable(table), idempotent.WithRetention(30*24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	deleted, err := cleanMW.ClaimTable().CleanupConsumer(ctx, cleanMW.Config().Consumer, idempotent.DefaultCleanupOptions())
	if err != nil {
		t.Fatalf("Cleanup as the cleanup role: %v", err)
	}
	var left int64
	if err := admin.QueryRow("SELECT count(*) FROM " + claims).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if deleted != 1 || left != order-1 {
		t.Fatalf("cleanup deleted %d claims and left %d, want 1 and %d", deleted, left, order-1)
	}
	if _, err := cleanDB.Exec("INSERT INTO " + claims + " (consumer, message_key) VALUES ('loyalty', 'x')"); !isDenied(err) {
		t.Fatalf("INSERT of a claim as the cleanup role: %v, want permission denied", err)
	}
}

func mustExec(t *testing.T, db *sql.DB, q string) {
	t.Helper()
	if _, err := db.Exec(q); err != nil {
		t.Fatalf("%v\n%s", err, q)
	}
}
