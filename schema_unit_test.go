package idempotent_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/postgres"
)

// Unit tests of EnsureSchema on go-sqlmock: it reads the catalog first and
// sends DDL only for what is missing, under the schema lock and a lock
// timeout, and says so when it gives up waiting.

// The Postgres dialect's objects of shop.claims, and what EnsureSchema
// sends for them.
var (
	shopObjects  = pg.SchemaObjects(shopClaims, false)
	shopTable    = shopObjects[0]
	shopIndex    = shopObjects[1]
	shopHorizon  = shopObjects[2]
	schemaLock   = pg.SchemaLockSQL(shopClaims)
	ddlTimeout   = "SET LOCAL lock_timeout = 5000"
	readOnlyTx   = "BEGIN READ ONLY"
	lockTimedOut = &pq.Error{Code: "55P03", Message: "canceling statement due to lock timeout"}
)

// expectExists scripts the catalog's answer for o and returns the query.
func expectExists(m sqlmock.Sqlmock, o dialect.SchemaObject, exists bool) string {
	q, args := pg.ObjectExistsSQL(o)
	vals := make([]driver.Value, len(args))
	for i, a := range args {
		vals[i] = a
	}
	m.ExpectQuery(q).WithArgs(vals...).WillReturnRows(sqlmock.NewRows([]string{"exists"}).AddRow(exists))
	return q
}

// expectCheck scripts the read-only transaction that checks the server and
// the catalog, with the answer for each of shop.claims' objects.
func expectCheck(m sqlmock.Sqlmock, table, index bool) []string {
	m.ExpectBegin()
	expectVersion(m, "PostgreSQL 16.4")
	calls := []string{readOnlyTx, versionSQL, expectExists(m, shopTable, table), expectExists(m, shopIndex, index), expectExists(m, shopHorizon, table)}
	m.ExpectCommit()
	return append(calls, "COMMIT")
}

func TestEnsureSchemaSendsNoDDLWhenEverythingExists(t *testing.T) {
	ctx := context.Background()
	for name, ensure := range map[string]func(*recorded) error{
		"ClaimTable": func(r *recorded) error { return newClaimTable(t, r).EnsureSchema(ctx) },
		"Middleware": func(r *recorded) error {
			return newMiddleware(t, r, idempotent.WithTable("shop.claims")).EnsureSchema(ctx)
		},
	} {
		t.Run(name, func(t *testing.T) {
			r := newRecorded(t)
			calls := expectCheck(r.mock, true, true)
			calls = append(calls, expectTableKind(r.mock, shopClaims, true, false))
			if err := ensure(r); err != nil {
				t.Fatal(err)
			}
			r.wantCalls(t, calls...)
		})
	}
}

// expectCreate scripts the start of the transaction that creates what is
// missing: BEGIN, the schema lock and the DDL lock timeout.
func expectCreate(m sqlmock.Sqlmock, timeoutSQL string) []string {
	m.ExpectBegin()
	m.ExpectExec(schemaLock).WillReturnResult(sqlmock.NewResult(0, 0))
	m.ExpectExec(timeoutSQL).WillReturnResult(sqlmock.NewResult(0, 0))
	return []string{"BEGIN", schemaLock, timeoutSQL}
}

// expectDDL scripts a statement that succeeds and returns it.
func expectDDL(m sqlmock.Sqlmock, s string) string {
	m.ExpectExec(s).WillReturnResult(sqlmock.NewResult(0, 0))
	return s
}

// EnsureSchema creates, under the lock, what the catalog still says is
// missing once the lock is held: a first look outside the lock decides
// only whether to take it.
func TestEnsureSchemaCreatesWhatIsMissing(t *testing.T) {
	for _, c := range []struct {
		name                     string
		table, index             bool // the first look
		lockedTable, lockedIndex bool // the look under the lock
	}{
		{"everything", false, false, false, false},
		{"the index of a table created by hand", true, false, true, false},
		{"created by another process meanwhile", false, false, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRecorded(t)
			calls := expectCheck(r.mock, c.table, c.index)
			calls = append(calls, expectCreate(r.mock, ddlTimeout)...)
			calls = append(calls, expectExists(r.mock, shopTable, c.lockedTable))
			if !c.lockedTable {
				calls = append(calls, expectDDL(r.mock, shopTable.CreateSQL))
			}
			calls = append(calls, expectExists(r.mock, shopIndex, c.lockedIndex))
			if !c.lockedIndex {
				calls = append(calls, expectDDL(r.mock, shopIndex.CreateSQL))
			}
			calls = append(calls, expectExists(r.mock, shopHorizon, c.lockedTable))
			if !c.lockedTable {
				calls = append(calls, expectDDL(r.mock, shopHorizon.CreateSQL))
			}
			r.mock.ExpectCommit()
			calls = append(calls, "COMMIT", expectTableKind(r.mock, shopClaims, true, false))
			if err := newClaimTable(t, r).EnsureSchema(context.Background()); err != nil {
				t.Fatal(err)
			}
			r.wantCalls(t, calls...)
		})
	}
}

// A CREATE that fails because another process created the object
// meanwhile (a database without a schema lock: MySQL's CREATE INDEX has no
// IF NOT EXISTS) is forgiven when the catalog then has the object.
func TestEnsureSchemaForgivesACreateThatLostARace(t *testing.T) {
	r := newRecorded(t)
	calls := expectCheck(r.mock, true, false)
	calls = append(calls, expectCreate(r.mock, ddlTimeout)...)
	calls = append(calls, expectExists(r.mock, shopTable, true), expectExists(r.mock, shopIndex, false))
	r.mock.ExpectExec(shopIndex.CreateSQL).WillReturnError(errors.New("duplicate key name"))
	calls = append(calls, shopIndex.CreateSQL, expectExists(r.mock, shopIndex, true), expectExists(r.mock, shopHorizon, true))
	r.mock.ExpectCommit()
	calls = append(calls, "COMMIT", expectTableKind(r.mock, shopClaims, true, false))
	if err := newClaimTable(t, r).EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.wantCalls(t, calls...)
}

// A CREATE INDEX that runs out of the lock timeout is not retried: the
// error says EnsureSchema gave up waiting for the lock on the table, and
// that it is safe to run again.
func TestEnsureSchemaGivesUpWaitingForTheLock(t *testing.T) {
	r := newRecorded(t)
	calls := expectCheck(r.mock, true, false)
	calls = append(calls, expectCreate(r.mock, ddlTimeout)...)
	calls = append(calls, expectExists(r.mock, shopTable, true), expectExists(r.mock, shopIndex, false))
	r.mock.ExpectExec(shopIndex.CreateSQL).WillReturnError(lockTimedOut)
	// The failure aborted the transaction: the second look fails too.
	q, _ := pg.ObjectExistsSQL(shopIndex)
	r.mock.ExpectQuery(q).WillReturnError(&pq.Error{Code: "25P02"})
	r.mock.ExpectRollback()
	calls = append(calls, shopIndex.CreateSQL, q, "ROLLBACK")
	err := newClaimTable(t, r).EnsureSchema(context.Background())
	if !errors.Is(err, idempotent.ErrSchemaLockTimeout) || !errors.Is(err, lockTimedOut) {
		t.Fatalf("got %v, want ErrSchemaLockTimeout wrapping the 55P03", err)
	}
	for _, says := range []string{
		"gave up waiting for the lock on claim table shop.claims",
		"to create index claims_processed_at of shop.claims",
		"waited 5s",
		"safe to retry",
	} {
		if !strings.Contains(err.Error(), says) {
			t.Errorf("error %q does not say %q", err, says)
		}
	}
	r.wantCalls(t, calls...)
}

func TestEnsureSchemaFailures(t *testing.T) {
	ctx := context.Background()
	t.Run("wrong database", func(t *testing.T) {
		r := newRecorded(t)
		mw := newMiddleware(t, r, idempotent.WithTable("shop.claims"))
		r.mock.ExpectBegin()
		expectVersion(r.mock, "10.11.6-MariaDB")
		r.mock.ExpectRollback()
		if err := mw.EnsureSchema(ctx); !errors.Is(err, dialect.ErrWrongDatabase) {
			t.Fatalf("got %v, want ErrWrongDatabase", err)
		}
		r.wantCalls(t, readOnlyTx, versionSQL, "ROLLBACK")
	})
	t.Run("missing schema", func(t *testing.T) {
		r := newRecorded(t)
		noSchema := &pq.Error{Code: "3F000"}
		calls := expectCheck(r.mock, false, false)
		calls = append(calls, expectCreate(r.mock, ddlTimeout)...)
		calls = append(calls, expectExists(r.mock, shopTable, false))
		r.mock.ExpectExec(shopTable.CreateSQL).WillReturnError(noSchema)
		q, _ := pg.ObjectExistsSQL(shopTable)
		r.mock.ExpectQuery(q).WillReturnError(&pq.Error{Code: "25P02"})
		r.mock.ExpectRollback()
		calls = append(calls, shopTable.CreateSQL, q, "ROLLBACK")
		err := newMiddleware(t, r, idempotent.WithTable("shop.claims")).EnsureSchema(ctx)
		if !errors.Is(err, noSchema) || errors.Is(err, idempotent.ErrSchemaLockTimeout) ||
			!strings.Contains(err.Error(), "ensure schema of shop.claims: create table shop.claims") {
			t.Fatalf("got %v, want the schema error naming the table", err)
		}
		r.wantCalls(t, calls...)
	})
	t.Run("partitioned table, plain ClaimTable", func(t *testing.T) {
		r := newRecorded(t)
		expectCheck(r.mock, true, true)
		expectTableKind(r.mock, shopClaims, true, true)
		if err := newClaimTable(t, r).EnsureSchema(ctx); err == nil || err.Error() != "idempotent: claim table shop.claims is partitioned, but the ClaimTable was not given WithDailyPartitions" {
			t.Fatalf("got %v", err)
		}
	})
}

// The Middleware's EnsureSchema probes the strict guard's query in the
// transaction that checks the catalog.
func TestEnsureSchemaProbesTheStrictGuard(t *testing.T) {
	r := newRecorded(t)
	mw := newMiddleware(t, r, idempotent.WithTable("shop.claims"), idempotent.WithStrictGuard())
	r.mock.ExpectBegin()
	expectVersion(r.mock, "PostgreSQL 16.4")
	r.mock.ExpectQuery(txidSQL).WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow("77"))
	calls := []string{readOnlyTx, versionSQL, txidSQL, expectExists(r.mock, shopTable, true), expectExists(r.mock, shopIndex, true), expectExists(r.mock, shopHorizon, true)}
	r.mock.ExpectCommit()
	calls = append(calls, "COMMIT", expectTableKind(r.mock, shopClaims, true, false))
	if err := mw.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.wantCalls(t, calls...)
}

// sessionTimeout is the Postgres dialect with a DDL lock timeout that
// outlives the transaction, as MySQL's lock_wait_timeout does.
type sessionTimeout struct{ *postgres.Dialect }

const sessionTimeoutSQL = "SET lock_timeout = 5000"

func (sessionTimeout) DDLLockTimeoutSQL(time.Duration) (string, bool) { return sessionTimeoutSQL, true }

// A session-scoped DDL lock timeout never reaches the pool: the connection
// that created the objects is closed, and the next statement opens another.
func TestEnsureSchemaClosesTheConnectionOfASessionTimeout(t *testing.T) {
	r := newRecorded(t)
	tab, err := idempotent.NewClaimTable(r.db, sessionTimeout{pg}, noWait, idempotent.WithTable("shop.claims"))
	if err != nil {
		t.Fatal(err)
	}
	calls := expectCheck(r.mock, true, false)
	calls = append(calls, expectCreate(r.mock, sessionTimeoutSQL)...)
	calls = append(calls, expectExists(r.mock, shopTable, true), expectExists(r.mock, shopIndex, false), expectDDL(r.mock, shopIndex.CreateSQL), expectExists(r.mock, shopHorizon, true))
	r.mock.ExpectCommit()
	calls = append(calls, "COMMIT", expectTableKind(r.mock, shopClaims, true, false))
	if err := tab.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.wantCalls(t, calls...)
	// One connection for the check (reused for the DDL), closed after the
	// DDL; one more for the table's kind.
	if n := r.connects.Load(); n != 2 {
		t.Errorf("%d connections opened, want 2: the DDL's connection must be closed, not pooled", n)
	}
}
