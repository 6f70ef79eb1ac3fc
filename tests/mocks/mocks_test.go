// Package mocks_test runs the mocks package against every dialect (Postgres,
// MySQL/MariaDB, SQLite and a fake), from the tests module so that the core
// module does not depend on the MySQL and SQLite drivers.
package mocks_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/mocks"
	"github.com/txclaim/idempotent/mysql"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/sqlite"
)

// fakeDialect is a dialect unlike Postgres in every statement: ? parameters,
// its own lock timeout and transaction id statements (or none), its own
// error type.
type fakeDialect struct{ noLock, noTxID bool }

type fakeError struct{ retryable bool }

func (e *fakeError) Error() string { return fmt.Sprintf("fake error (retryable %v)", e.retryable) }

func (fakeDialect) Name() string     { return "fake" }
func (fakeDialect) MaxKeyBytes() int { return 64 }
func (fakeDialect) SchemaSQL(t dialect.Table) []string {
	return []string{"CREATE TABLE IF NOT EXISTS " + t.Quoted(bq) + " (consumer TEXT, message_key TEXT)", "ANALYZE " + t.Quoted(bq)}
}
func (fakeDialect) ClaimSQL(t dialect.Table) string {
	return "INSERT IGNORE INTO " + t.Quoted(bq) + " (consumer, message_key) VALUES (?, ?)"
}
func (d fakeDialect) LockTimeoutSQL(t time.Duration) string {
	if d.noLock {
		return ""
	}
	return fmt.Sprintf("SET SESSION lock_wait_ms = %d", t.Milliseconds())
}
func (d fakeDialect) TxIDSQL() string {
	if d.noTxID {
		return ""
	}
	return "SELECT current_trx()"
}
func (fakeDialect) Classify(err error) dialect.Class {
	var fe *fakeError
	switch {
	case errors.As(err, &fe) && fe.retryable:
		return dialect.Class{Kind: dialect.KindSerialization, Code: "R"}
	case errors.Is(err, driver.ErrBadConn):
		return dialect.Class{Kind: dialect.KindConnection}
	}
	return dialect.Class{Kind: dialect.KindOther}
}

func bq(s string) string { return "`" + s + "`" }

// dialectCase is one dialect with its errors.
type dialectCase struct {
	name      string
	d         dialect.Dialect
	retryable error // a serialization failure or lost connection
	fatal     error // an error that is not retried
	// txGone is what the transaction check meets after the transaction
	// suffered retryable: aborted, or its connection lost.
	txGone error
	// server answers the dialect's server check, for ExpectEnsureSchema
	// with the table "s.claims".
	server []string
}

var dialects = []dialectCase{
	{"postgres", postgres.New(), &pq.Error{Code: "40001"}, &pq.Error{Code: "23502"}, &pq.Error{Code: "25P02"}, []string{"PostgreSQL 16.4 on x86_64-pc-linux-gnu"}},
	{"postgres-deadlock", postgres.New(), &pq.Error{Code: "40P01"}, &pq.Error{Code: "22001"}, &pq.Error{Code: "25P02"}, []string{"CockroachDB CCL v23.1"}},
	{"mysql", mysql.New(), &mysqldrv.MySQLError{Number: 1213}, &mysqldrv.MySQLError{Number: 1048}, &mysqldrv.MySQLError{Number: 1305}, []string{"10.11.6-MariaDB", "YES", "InnoDB"}},
	{"sqlite", sqlite.New(), driver.ErrBadConn, errors.New("constraint failed"), driver.ErrBadConn, []string{"3.46.0"}},
	{"fake", fakeDialect{}, &fakeError{retryable: true}, &fakeError{}, &fakeError{}, nil},
}

// supports reports whether d can run the Middleware options of cfg.
func supports(d dialect.Dialect, cfg config) bool {
	_, err := idempotent.New(&sql.DB{}, d, "c", cfg.mw...)
	return err == nil
}

// config is one way the Middleware under test is set up, with the matching
// Mock options.
type config struct {
	name string
	mw   []idempotent.Option
	mock []mocks.Option
}

var configs = []config{
	{"defaults", nil, nil},
	{"table", []idempotent.Option{idempotent.WithTable("shop.claims")}, []mocks.Option{mocks.WithTable("shop.claims")}},
	{"lock-timeout", []idempotent.Option{idempotent.WithLockTimeout(1500 * time.Millisecond)}, []mocks.Option{mocks.WithLockTimeout(1500 * time.Millisecond)}},
	{"strict-guard", []idempotent.Option{idempotent.WithStrictGuard()}, []mocks.Option{mocks.WithStrictGuard()}},
	{"all", []idempotent.Option{idempotent.WithTable("claims"), idempotent.WithLockTimeout(time.Second), idempotent.WithStrictGuard()},
		[]mocks.Option{mocks.WithTable("claims"), mocks.WithLockTimeout(time.Second), mocks.WithStrictGuard()}},
}

var fastRetry = idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 3})

const key = "order-completed:9912"

// effect is the handler's one statement, with ? or $ parameters to suit
// neither dialect in particular: sqlmock matches it as text.
const effectSQL = "UPDATE balances SET points = points + 50 WHERE customer_id = 7"

func effect(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, effectSQL)
	return err
}

func expectEffect(m *mocks.Mock) {
	m.ExpectExec(effectSQL).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 1))
}

// TestDeliveries runs a real Middleware against each script, for every
// dialect and configuration: the scripts must match the middleware's
// statements exactly, and New's cleanup checks every expectation was met.
func TestDeliveries(t *testing.T) {
	type scenario struct {
		name    string
		script  func(m *mocks.Mock, dc dialectCase)
		want    idempotent.Outcome
		wantErr func(dc dialectCase, err error) bool
	}
	scenarios := []scenario{
		{"applied", func(m *mocks.Mock, _ dialectCase) {
			m.ExpectApplied(key)
			expectEffect(m)
			m.ExpectCommit()
		}, idempotent.Applied, nil},
		{"duplicate", func(m *mocks.Mock, _ dialectCase) {
			m.ExpectDuplicate(key)
		}, idempotent.Duplicate, nil},
		{"claim-retryable-then-applied", func(m *mocks.Mock, dc dialectCase) {
			m.ExpectClaimError(key, dc.retryable)
			m.ExpectApplied(key)
			expectEffect(m)
			m.ExpectCommit()
		}, idempotent.Applied, nil},
		{"claim-retryable-then-duplicate", func(m *mocks.Mock, dc dialectCase) {
			m.ExpectClaimError(key, dc.retryable)
			m.ExpectDuplicate(key)
		}, idempotent.Duplicate, nil},
		{"claim-fatal", func(m *mocks.Mock, dc dialectCase) {
			m.ExpectClaimError(key, dc.fatal)
		}, 0, func(dc dialectCase, err error) bool { return errors.Is(err, dc.fatal) }},
		{"claim-retries-exhausted", func(m *mocks.Mock, dc dialectCase) {
			for range 3 {
				m.ExpectClaimError(key, dc.retryable)
			}
		}, 0, func(dc dialectCase, err error) bool {
			var re *idempotent.RetriesExhaustedError
			return errors.As(err, &re) && re.Attempts == 3 && errors.Is(err, dc.retryable)
		}},
		{"commit-retryable-then-applied", func(m *mocks.Mock, dc dialectCase) {
			m.ExpectApplied(key)
			expectEffect(m)
			m.ExpectCommitError(dc.retryable)
			m.ExpectApplied(key)
			expectEffect(m)
			m.ExpectCommit()
		}, idempotent.Applied, nil},
		{"commit-lost-connection-landed", func(m *mocks.Mock, _ dialectCase) {
			m.ExpectApplied(key)
			expectEffect(m)
			m.ExpectCommitError(driver.ErrBadConn) // database/sql discards the connection
			m.ExpectDuplicate(key)                 // the commit had landed
		}, idempotent.Duplicate, nil},
		{"commit-fatal", func(m *mocks.Mock, dc dialectCase) {
			m.ExpectApplied(key)
			expectEffect(m)
			m.ExpectCommitError(dc.fatal)
		}, 0, func(dc dialectCase, err error) bool { return errors.Is(err, dc.fatal) }},
		{"effect-error-rolls-back", func(m *mocks.Mock, dc dialectCase) {
			m.ExpectApplied(key)
			m.ExpectExec(effectSQL).WillReturnError(dc.fatal)
			m.ExpectRollback()
		}, 0, func(dc dialectCase, err error) bool { return errors.Is(err, dc.fatal) }},
		{"effect-retryable-then-applied", func(m *mocks.Mock, dc dialectCase) {
			m.ExpectApplied(key)
			m.ExpectExec(effectSQL).WillReturnError(dc.retryable)
			m.ExpectTxCheck(dc.txGone)
			m.ExpectRollback()
			m.ExpectApplied(key)
			expectEffect(m)
			m.ExpectCommit()
		}, idempotent.Applied, nil},
		{"effect-retryable-elsewhere-returned", func(m *mocks.Mock, dc dialectCase) {
			m.ExpectApplied(key)
			m.ExpectExec(effectSQL).WillReturnError(dc.retryable)
			m.ExpectTxCheck(nil)
			m.ExpectRollback()
		}, 0, func(dc dialectCase, err error) bool {
			return errors.Is(err, dc.retryable) && !errors.Is(err, idempotent.ErrRetriesExhausted)
		}},
	}
	for _, dc := range dialects {
		for _, cfg := range configs {
			if !supports(dc.d, cfg) {
				continue // the SQLite dialect has no lock timeout and no transaction id
			}
			for _, sc := range scenarios {
				t.Run(dc.name+"/"+cfg.name+"/"+sc.name, func(t *testing.T) {
					t.Parallel()
					db, mock := mocks.New(t)
					mw, err := idempotent.New(db, dc.d, "loyalty", append([]idempotent.Option{fastRetry}, cfg.mw...)...)
					if err != nil {
						t.Fatal(err)
					}
					m := mocks.For(mock, dc.d, "loyalty", cfg.mock...)
					sc.script(m, dc)
					got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect)
					if sc.wantErr != nil {
						if err == nil || !sc.wantErr(dc, err) {
							t.Fatalf("got (%v, %v), want the scenario's error", got, err)
						}
						return
					}
					if err != nil || got != sc.want {
						t.Fatalf("got (%v, %v), want %v", got, err, sc.want)
					}
				})
			}
		}
	}
}

// TestForMiddleware reads dialect, consumer, table, lock timeout and strict
// guard from the Middleware, with no option repeated.
func TestForMiddleware(t *testing.T) {
	for _, dc := range dialects {
		t.Run(dc.name, func(t *testing.T) {
			db, mock := mocks.New(t)
			opts := []idempotent.Option{idempotent.WithTable("ops.claims")}
			if dc.d.TxIDSQL() != "" {
				opts = append(opts, idempotent.WithStrictGuard())
			}
			if dc.d.LockTimeoutSQL(time.Second) != "" {
				opts = append(opts, idempotent.WithLockTimeout(time.Second))
			}
			mw, err := idempotent.New(db, dc.d, "billing", opts...)
			if err != nil {
				t.Fatal(err)
			}
			m := mocks.ForMiddleware(mock, mw)
			m.ExpectApplied(key)
			expectEffect(m)
			m.ExpectCommit()
			if got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect); err != nil || got != idempotent.Applied {
				t.Fatalf("got (%v, %v)", got, err)
			}
		})
	}
}

// TestExpectClaim scripts Middleware.Claim in a transaction of the test's.
func TestExpectClaim(t *testing.T) {
	db, mock := mocks.New(t)
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithLockTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m := mocks.For(mock, postgres.New(), "loyalty", mocks.WithLockTimeout(time.Second))
	m.ExpectBegin()
	m.ExpectClaim(key).WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectClaim("other").WillReturnResult(sqlmock.NewResult(0, 0))
	m.ExpectClaim("busy").WillReturnError(&pq.Error{Code: "55P03"})
	m.ExpectRollback()

	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := mw.ClaimMessage(ctx, tx, idempotent.Message{Key: key}); err != nil || !ok {
		t.Fatalf("claim %q: got (%v, %v), want (true, nil)", key, ok, err)
	}
	if ok, err := mw.ClaimMessage(ctx, tx, idempotent.Message{Key: "other"}); err != nil || ok {
		t.Fatalf("claim other: got (%v, %v), want (false, nil)", ok, err)
	}
	if _, err := mw.ClaimMessage(ctx, tx, idempotent.Message{Key: "busy"}); !errors.Is(err, idempotent.ErrClaimBusy) {
		t.Fatalf("claim busy: got %v, want ErrClaimBusy", err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
}

func TestExpectEnsureSchema(t *testing.T) {
	for _, dc := range dialects {
		t.Run(dc.name, func(t *testing.T) {
			db, mock := mocks.New(t)
			mw, err := idempotent.New(db, dc.d, "loyalty", idempotent.WithTable("s.claims"))
			if err != nil {
				t.Fatal(err)
			}
			mocks.ForMiddleware(mock, mw).ExpectEnsureSchema(dc.server...)
			if err := mw.EnsureSchema(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("mysql without a schema asks for the database", func(t *testing.T) {
		db, mock := mocks.New(t)
		mw, err := idempotent.New(db, mysql.New(), "loyalty")
		if err != nil {
			t.Fatal(err)
		}
		mocks.ForMiddleware(mock, mw).ExpectEnsureSchema("8.0.36", "shop", "DEFAULT") // no claim table yet: no engine
		if err := mw.EnsureSchema(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

func TestExpectEnsureSchemaRejects(t *testing.T) {
	_, mock, err := mocks.Open()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		d       dialect.Dialect
		answers []string
		want    string
	}{
		{"wrong server", postgres.New(), []string{"10.11.6-MariaDB"}, "rejects the answers"},
		{"no answers", postgres.New(), nil, "rejects the answers"},
		{"too many answers", postgres.New(), []string{"PostgreSQL 16", "extra"}, "asks 1 queries, yet 2 answers were given"},
		{"MyISAM claim table", mysql.New(), []string{"8.0.36", "shop", "YES", "MyISAM"}, "must be InnoDB"},
		{"answers for no check", fakeDialect{}, []string{"x"}, "runs no server check"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				p := recover()
				if s, ok := p.(string); !ok || !strings.Contains(s, c.want) {
					t.Fatalf("panic %v, want one containing %q", p, c.want)
				}
			}()
			mocks.For(mock, c.d, "c").ExpectEnsureSchema(c.answers...)
		})
	}
}

// TestScriptMismatch shows the scripts are exact: a Mock not told of the
// Middleware's lock timeout, strict guard, table or consumer does not match,
// and the delivery fails instead of passing by accident.
func TestScriptMismatch(t *testing.T) {
	cases := []struct {
		name string
		mw   []idempotent.Option
		mock []mocks.Option
		cons string
	}{
		{"lock timeout not scripted", []idempotent.Option{idempotent.WithLockTimeout(time.Second)}, nil, "loyalty"},
		{"lock timeout differs", []idempotent.Option{idempotent.WithLockTimeout(time.Second)}, []mocks.Option{mocks.WithLockTimeout(2 * time.Second)}, "loyalty"},
		{"strict guard not scripted", []idempotent.Option{idempotent.WithStrictGuard()}, nil, "loyalty"},
		{"strict guard not in the middleware", nil, []mocks.Option{mocks.WithStrictGuard()}, "loyalty"},
		{"table differs", []idempotent.Option{idempotent.WithTable("a.claims")}, []mocks.Option{mocks.WithTable("b.claims")}, "loyalty"},
		{"consumer differs", nil, nil, "billing"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			db, mock, err := mocks.Open()
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			mw, err := idempotent.New(db, postgres.New(), "loyalty", c.mw...)
			if err != nil {
				t.Fatal(err)
			}
			m := mocks.For(mock, postgres.New(), c.cons, c.mock...)
			m.ExpectApplied(key)
			expectEffect(m)
			m.ExpectCommit()
			_, perr := mw.ProcessMessage(context.Background(), idempotent.Message{Key: key}, effect)
			if perr == nil && mock.ExpectationsWereMet() == nil {
				t.Fatal("a mismatched script passed")
			}
		})
	}
}

// recorder is a testing.TB whose failures are recorded instead of failing
// the test, for checking what New's cleanup reports.
type recorder struct {
	testing.TB
	cleanups []func()
	errs     []string
	failed   bool
}

func (r *recorder) Helper()          {}
func (r *recorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *recorder) Failed() bool     { return r.failed }
func (r *recorder) Errorf(f string, a ...any) {
	r.failed = true
	r.errs = append(r.errs, fmt.Sprintf(f, a...))
}
func (r *recorder) Fatalf(f string, a ...any) { r.Errorf(f, a...) }

func (r *recorder) finish() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

func TestNewCleanupReports(t *testing.T) {
	t.Run("met", func(t *testing.T) {
		r := &recorder{TB: t}
		db, mock := mocks.New(r)
		mock.ExpectExec("SELECT 1").WillReturnResult(sqlmock.NewResult(0, 0))
		if _, err := db.Exec("SELECT 1"); err != nil {
			t.Fatal(err)
		}
		r.finish()
		if len(r.errs) != 0 {
			t.Fatalf("cleanup reported %q", r.errs)
		}
		if db.Driver() == nil {
			t.Fatal("no driver")
		}
		if err := db.Ping(); err == nil || !strings.Contains(err.Error(), "closed") {
			t.Fatalf("database not closed by the cleanup: ping gave %v", err)
		}
	})
	t.Run("unmet expectation", func(t *testing.T) {
		r := &recorder{TB: t}
		_, mock := mocks.New(r)
		mock.ExpectBegin()
		r.finish()
		if len(r.errs) != 1 || !strings.Contains(r.errs[0], "remaining expectation") {
			t.Fatalf("cleanup reported %q, want the unmet BEGIN", r.errs)
		}
	})
	t.Run("connection left in use", func(t *testing.T) {
		r := &recorder{TB: t}
		db, mock := mocks.New(r)
		mock.ExpectBegin()
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		r.finish()
		if len(r.errs) != 1 || !strings.Contains(r.errs[0], "1 connection(s) still in use") {
			t.Fatalf("cleanup reported %q, want the open transaction", r.errs)
		}
		_ = tx
	})
	t.Run("exact matching", func(t *testing.T) {
		r := &recorder{TB: t}
		db, mock := mocks.New(r)
		// A regexp matcher would accept this; the exact one must not.
		mock.ExpectExec("SELECT .*").WillReturnResult(sqlmock.NewResult(0, 0))
		if _, err := db.Exec("SELECT 1"); err == nil {
			t.Fatal("SELECT 1 matched SELECT .*")
		}
		r.finish()
		if len(r.errs) != 1 {
			t.Fatalf("cleanup reported %q, want the unmet expectation", r.errs)
		}
	})
}

func TestForRejects(t *testing.T) {
	db, mock, err := mocks.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "c")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		call func()
		want string
	}{
		{"nil mock", func() { mocks.For(nil, postgres.New(), "c") }, "nil sqlmock"},
		{"nil dialect", func() { mocks.For(mock, nil, "c") }, "nil dialect"},
		{"nil option", func() { mocks.For(mock, postgres.New(), "c", nil) }, "nil option"},
		{"bad table", func() { mocks.For(mock, postgres.New(), "c", mocks.WithTable("a.b.c")) }, `table name "a.b.c"`},
		{"bad lock timeout", func() { mocks.For(mock, postgres.New(), "c", mocks.WithLockTimeout(0)) }, "not a positive duration"},
		{"no lock timeout in dialect", func() { mocks.For(mock, fakeDialect{noLock: true}, "c", mocks.WithLockTimeout(time.Second)) }, "cannot bound lock waits"},
		{"no txid in dialect", func() { mocks.For(mock, fakeDialect{noTxID: true}, "c", mocks.WithStrictGuard()) }, "cannot identify transactions"},
		{"nil middleware", func() { mocks.ForMiddleware(mock, nil) }, "nil Middleware"},
		{"nil mock for a middleware", func() { mocks.ForMiddleware(nil, mw) }, "ForMiddleware: nil sqlmock"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				p := recover()
				if s, ok := p.(string); !ok || !strings.Contains(s, c.want) {
					t.Fatalf("panic %v, want one containing %q", p, c.want)
				}
			}()
			c.call()
		})
	}
}

// TestProcessMessageWithEventTime scripts ProcessMessage of a message with
// an event time on a table that is not partitioned: the event time is
// checked before any transaction, and the statements are those of a
// message without one.
func TestProcessMessageWithEventTime(t *testing.T) {
	db, mock := mocks.New(t)
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithRetention(30*24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	m := mocks.ForMiddleware(mock, mw)
	at := time.Now().Add(-time.Hour)
	m.ExpectAppliedAt(key, at)
	expectEffect(m)
	m.ExpectCommit()
	ctx := context.Background()
	if got, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key, EventTime: at}, effect); err != nil || got != idempotent.Applied {
		t.Fatalf("got (%v, %v), want applied", got, err)
	}
	// Older than the window: refused with nothing sent.
	if _, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key, EventTime: time.Now().Add(-40 * 24 * time.Hour)}, effect); !errors.Is(err, idempotent.ErrBeyondRetention) {
		t.Fatalf("got %v, want ErrBeyondRetention", err)
	}
}
