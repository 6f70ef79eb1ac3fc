package tests

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
)

// preparedSeq numbers the statements the guard tests prepare outside a
// handler.
var preparedSeq atomic.Int64

// guardFixture is a loyalty service plus an "escaped" table that handlers
// write to outside the transaction, and a sequence whose nextval proves
// whether a statement reached the server (sequences ignore rollbacks).
type guardFixture struct {
	*loyalty
	q string
}

func newGuardFixture(t *testing.T, db *sql.DB, opts ...idempotent.Option) *guardFixture {
	t.Helper()
	l := newLoyalty(t, db, opts...)
	q := pq.QuoteIdentifier(l.schema)
	if _, err := db.Exec("CREATE TABLE " + q + ".escaped (note text); CREATE SEQUENCE " + q + ".reached"); err != nil {
		t.Fatal(err)
	}
	return &guardFixture{loyalty: l, q: q}
}

// assertNothingWritten checks that neither the claim, nor the effect, nor
// the escaped statement was written, and that no escaped statement reached
// the server.
func (f *guardFixture) assertNothingWritten(t *testing.T, key string, customer int64) {
	t.Helper()
	if n := claims(t, f.db, f.schema+".processed_messages", "loyalty", key); n != 0 {
		t.Errorf("%d claims, want 0", n)
	}
	if b := f.balance(t, customer); b != 0 {
		t.Errorf("balance %d, want 0", b)
	}
	if n := count(t, f.db, "SELECT count(*) FROM "+f.q+".escaped"); n != 0 {
		t.Errorf("%d escaped rows were written outside the transaction", n)
	}
	var called bool
	if err := f.db.QueryRow("SELECT is_called FROM " + f.q + ".reached").Scan(&called); err != nil {
		t.Fatal(err)
	}
	if called {
		t.Error("an escaped statement reached the database (the sequence advanced)")
	}
}

// The classic bug — the handler uses the *sql.DB (or anything but the tx)
// with its context — fails with ErrAutocommit before reaching the database,
// and the whole transaction rolls back even if the handler swallows the error.
func TestGuardCatchesStatementsOutsideTheTransaction(t *testing.T) {
	t.Parallel()
	type escape func(ctx context.Context, db *sql.DB, q string) error
	escapes := map[string]escape{
		"db.ExecContext": func(ctx context.Context, db *sql.DB, q string) error {
			_, err := db.ExecContext(ctx, "INSERT INTO "+q+".escaped VALUES ('exec'); SELECT nextval('"+q+".reached')")
			return err
		},
		"db.ExecContext with args": func(ctx context.Context, db *sql.DB, q string) error {
			_, err := db.ExecContext(ctx, "INSERT INTO "+q+".escaped SELECT $1 FROM nextval('"+q+".reached')", "exec")
			return err
		},
		"db.QueryRowContext": func(ctx context.Context, db *sql.DB, q string) error {
			var n int64
			return db.QueryRowContext(ctx, "SELECT nextval('"+q+".reached')").Scan(&n)
		},
		"db.QueryContext": func(ctx context.Context, db *sql.DB, q string) error {
			rows, err := db.QueryContext(ctx, "SELECT nextval($1)", q+".reached")
			if err == nil {
				_ = rows.Close()
			}
			return err
		},
		"db.PrepareContext": func(ctx context.Context, db *sql.DB, q string) error {
			s, err := db.PrepareContext(ctx, "INSERT INTO "+q+".escaped VALUES ($1)")
			if err == nil {
				_ = s.Close()
			}
			return err
		},
		"statement prepared outside": func(ctx context.Context, db *sql.DB, q string) error {
			// A text of its own each time: pgx names a prepared statement
			// after its text, and behind a transaction-mode pooler the
			// previous run's statement may still exist on the server
			// connection this Prepare lands on (its Close went to another).
			s, err := db.Prepare(fmt.Sprintf("SELECT nextval('%s.reached') /* %d */", q, preparedSeq.Add(1)))
			if err != nil {
				return fmt.Errorf("prepare outside the handler: %v", err) // not the guard's error
			}
			defer s.Close()
			var n int64
			return s.QueryRowContext(ctx).Scan(&n)
		},
		"sql.Conn": func(ctx context.Context, db *sql.DB, q string) error {
			c, err := db.Conn(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.ExecContext(ctx, "INSERT INTO "+q+".escaped VALUES ('conn')")
			return err
		},
		"derived context": func(ctx context.Context, db *sql.DB, q string) error {
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			_, err := db.ExecContext(ctx, "INSERT INTO "+q+".escaped VALUES ('derived')")
			return err
		},
		"db.BeginTx": func(ctx context.Context, db *sql.DB, q string) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+q+".escaped VALUES ('second tx')"); err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		},
	}
	names := slices.Sorted(maps.Keys(escapes))
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			db := openGuarded(t, drv, 3)
			f := newGuardFixture(t, db)
			customer := int64(0)
			for _, name := range names {
				for _, swallow := range []bool{false, true} {
					customer++
					sub := name + "/returned"
					if swallow {
						sub = name + "/swallowed"
					}
					t.Run(sub, func(t *testing.T) {
						msg := orderCompleted{OrderID: customer, CustomerID: customer, TotalCents: 100}
						var escErr error
						_, err := f.mw.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, func(ctx context.Context, tx *sql.Tx) error {
							if err := f.credit(ctx, tx, msg); err != nil {
								return err
							}
							escErr = escapes[name](ctx, db, f.q)
							if swallow {
								return nil
							}
							return escErr
						})
						if !errors.Is(escErr, idempotent.ErrAutocommit) {
							t.Errorf("the escaped statement returned %v, want ErrAutocommit", escErr)
						}
						if !errors.Is(err, idempotent.ErrAutocommit) {
							t.Fatalf("Process returned %v, want ErrAutocommit", err)
						}
						f.assertNothingWritten(t, msg.key(), msg.CustomerID)
					})
				}
			}
		})
	}
}

// RunTx guards its function the same way.
func TestGuardInRunTx(t *testing.T) {
	t.Parallel()
	db := openGuarded(t, "pq", 3)
	f := newGuardFixture(t, db)
	err := idempotent.RunTx(context.Background(), db, postgres.New(), nil, idempotent.DefaultRetryPolicy(), func(ctx context.Context, tx *sql.Tx) error {
		_, _ = db.ExecContext(ctx, "INSERT INTO "+f.q+".escaped VALUES ('x')")
		return nil
	})
	if !errors.Is(err, idempotent.ErrAutocommit) {
		t.Fatalf("RunTx: %v, want ErrAutocommit", err)
	}
	f.assertNothingWritten(t, "none", 1)
}

// A handler that commits or rolls back the transaction itself cannot end
// it on a guarded connection: tx.Commit and tx.Rollback fail with
// ErrAutocommit, the guard rolls the transaction back, and nothing of the
// attempt — claim or effect — is committed, whether the handler returns
// the error or swallows it, with and without the strict guard, in
// ProcessMessage, ProcessMessageTx and RunTx alike.
func TestGuardRefusesHandlerCommitOrRollback(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			db := openGuarded(t, drv, 2)
			f := newGuardFixture(t, db)
			strictMW := strictTwin(t, f)
			customer := int64(0)
			for _, entry := range []string{"ProcessMessage", "ProcessMessageTx", "RunTx"} {
				for _, strict := range []bool{false, true} {
					for _, end := range []string{"Commit", "Rollback"} {
						for _, swallow := range []bool{false, true} {
							customer++
							t.Run(fmt.Sprintf("%s/strict=%v/%s/swallow=%v", entry, strict, end, swallow), func(t *testing.T) {
								mw := f.mw
								if strict {
									mw = strictMW
								}
								msg := orderCompleted{OrderID: customer, CustomerID: customer, TotalCents: 200}
								var endErr error
								handler := func(ctx context.Context, tx *sql.Tx) error {
									if err := f.credit(ctx, tx, msg); err != nil {
										return err
									}
									if end == "Commit" {
										endErr = tx.Commit()
									} else {
										endErr = tx.Rollback()
									}
									if swallow {
										return nil
									}
									return fmt.Errorf("handler's own %s: %w", end, endErr)
								}
								var err error
								switch entry {
								case "ProcessMessage":
									_, err = mw.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, handler)
								case "ProcessMessageTx":
									// A begin function as a library wrapping *sql.Tx
									// (idemsqlx) has.
									begin := func(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*sql.Tx, *sql.Tx, error) {
										tx, err := db.BeginTx(ctx, opts)
										return tx, tx, err
									}
									_, err = idempotent.ProcessMessageTx(context.Background(), mw, idempotent.Message{Key: msg.key()}, begin, handler)
								case "RunTx":
									if strict {
										t.Skip("RunTx has no strict guard")
									}
									err = idempotent.RunTx(context.Background(), db, postgres.New(), nil, idempotent.DefaultRetryPolicy(), handler)
								}
								if !errors.Is(endErr, idempotent.ErrAutocommit) {
									t.Errorf("the handler's tx.%s returned %v, want ErrAutocommit", end, endErr)
								}
								if !errors.Is(err, idempotent.ErrAutocommit) {
									t.Fatalf("%s: %v, want ErrAutocommit", entry, err)
								}
								if n := strings.Count(err.Error(), "committed or rolled back the transaction itself"); n != 1 {
									t.Errorf("error states the cause %d times, want once: %v", n, err)
								}
								c := claims(t, db, f.schema+".processed_messages", "loyalty", msg.key())
								if b := f.balance(t, msg.CustomerID); c != 0 || b != 0 {
									t.Errorf("%d claims and balance %d after the handler's tx.%s, want nothing committed", c, b, end)
								}
							})
						}
					}
				}
			}
		})
	}
}

// strictTwin returns a Middleware like f's, on the same table, with
// WithStrictGuard.
func strictTwin(t *testing.T, f *guardFixture) *idempotent.Middleware {
	t.Helper()
	mw, err := idempotent.New(f.db, postgres.New(), "loyalty", idempotent.WithTable(f.schema+".processed_messages"), idempotent.WithStrictGuard())
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// An explicit COMMIT or ROLLBACK statement inside the handler would end the
// claim's transaction behind database/sql's back (with pgx, an explicit
// ROLLBACK would even be reported Applied with nothing committed). The guard
// refuses such a statement before it reaches the server; WithStrictGuard also
// checks the transaction id before commit. Either way the caller gets
// ErrAutocommit and claim and effect stay together.
func TestStrictGuardCatchesExplicitCommit(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			db := openGuarded(t, drv, 2)
			f := newGuardFixture(t, db)
			strictMW := strictTwin(t, f)
			customer := int64(0)
			for _, stmt := range []string{"COMMIT", "ROLLBACK", "COMMIT; BEGIN"} {
				for _, strict := range []bool{true, false} {
					customer++
					t.Run(fmt.Sprintf("%s/strict=%v", stmt, strict), func(t *testing.T) {
						mw := f.mw
						if strict {
							mw = strictMW
						}
						msg := orderCompleted{OrderID: customer, CustomerID: customer, TotalCents: 300}
						got, err := mw.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, func(ctx context.Context, tx *sql.Tx) error {
							if err := f.credit(ctx, tx, msg); err != nil {
								return err
							}
							_, err := tx.ExecContext(ctx, stmt)
							return err
						})
						c := claims(t, db, f.schema+".processed_messages", "loyalty", msg.key())
						b := f.balance(t, msg.CustomerID)
						if !errors.Is(err, idempotent.ErrAutocommit) {
							t.Fatalf("Process with an explicit %s: (%v, %v), want ErrAutocommit", stmt, got, err)
						}
						if c != 0 {
							t.Errorf("%d claims after an explicit %s, want 0 (the statement must not reach the server)", c, stmt)
						}
						// Claim and effect are still together.
						if int64(c)*pointsFor(msg) != b {
							t.Errorf("%d claims but balance %d: claim and effect split", c, b)
						}
					})
				}
			}
		})
	}
}

// The strict guard passes ordinary handlers, duplicates included.
func TestStrictGuardOrdinaryUse(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			db := openGuarded(t, drv, 8)
			l := newLoyalty(t, db, idempotent.WithStrictGuard())
			msg := orderCompleted{OrderID: 4, CustomerID: 4, TotalCents: 400}
			applied, dup, failures := tally(deliverConcurrently(l, 8, msg))
			if applied != 1 || dup != 7 || len(failures) != 0 {
				t.Fatalf("applied %d, duplicate %d, failed %v", applied, dup, failures)
			}
			if b := l.balance(t, 4); b != pointsFor(msg) {
				t.Errorf("balance %d, want %d", b, pointsFor(msg))
			}
		})
	}
}

// A guarded database behaves like any other outside handlers, and inside a
// handler everything done through the tx works: prepared statements, tx.Stmt
// of a statement prepared outside, and sql.Conn with its Raw escape hatch.
func TestGuardedDatabaseOrdinaryUse(t *testing.T) {
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			db := openGuarded(t, drv, 3)
			f := newGuardFixture(t, db)
			ctx := context.Background()
			if err := db.PingContext(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, "INSERT INTO "+f.q+".escaped VALUES ($1)", "plain"); err != nil {
				t.Fatal(err)
			}
			ins, err := db.PrepareContext(ctx, "INSERT INTO "+f.q+".escaped VALUES ($1)")
			if err != nil {
				t.Fatal(err)
			}
			defer ins.Close()
			if _, err := ins.ExecContext(ctx, "prepared"); err != nil {
				t.Fatal(err)
			}
			rows, err := db.QueryContext(ctx, "SELECT note FROM "+f.q+".escaped ORDER BY note")
			if err != nil {
				t.Fatal(err)
			}
			var notes []string
			for rows.Next() {
				var s string
				if err := rows.Scan(&s); err != nil {
					t.Fatal(err)
				}
				notes = append(notes, s)
			}
			if err := rows.Close(); err != nil {
				t.Fatal(err)
			}
			if strings.Join(notes, ",") != "plain,prepared" {
				t.Fatalf("notes %v", notes)
			}
			// An ordinary transaction, with a context of its own.
			tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.StmtContext(ctx, ins).ExecContext(ctx, "in tx"); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			// sql.Conn and Raw: Unwrap reaches the driver's own connection.
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := conn.ExecContext(ctx, "INSERT INTO "+f.q+".escaped VALUES ('conn')"); err != nil {
				t.Fatal(err)
			}
			err = conn.Raw(func(dc any) error {
				u, ok := dc.(interface{ Unwrap() driver.Conn })
				if !ok {
					return fmt.Errorf("guarded connection %T has no Unwrap", dc)
				}
				inner := u.Unwrap()
				if _, guarded := inner.(interface{ Unwrap() driver.Conn }); guarded {
					return fmt.Errorf("Unwrap returned another guarded connection %T", inner)
				}
				if _, ok := inner.(*stdlib.Conn); drv == "pgx" && !ok {
					return fmt.Errorf("Unwrap returned %T, want *stdlib.Conn", inner)
				}
				return nil
			})
			_ = conn.Close()
			if err != nil {
				t.Fatal(err)
			}
			// Inside a handler, through the tx.
			msg := orderCompleted{OrderID: 5, CustomerID: 5, TotalCents: 500}
			got, err := f.mw.ProcessMessage(ctx, idempotent.Message{Key: msg.key()}, func(ctx context.Context, tx *sql.Tx) error {
				s, err := tx.PrepareContext(ctx, "UPDATE "+f.q+".balances SET points = points + $1 WHERE customer_id = $2")
				if err != nil {
					return err
				}
				defer s.Close()
				if _, err := s.ExecContext(ctx, pointsFor(msg), msg.CustomerID); err != nil {
					return err
				}
				if _, err := tx.StmtContext(ctx, ins).ExecContext(ctx, "handler"); err != nil {
					return err
				}
				var n int
				return tx.QueryRowContext(ctx, "SELECT count(*) FROM "+f.q+".escaped").Scan(&n)
			})
			if err != nil || got != idempotent.Applied {
				t.Fatalf("Process: (%v, %v)", got, err)
			}
			if b := f.balance(t, msg.CustomerID); b != pointsFor(msg) {
				t.Errorf("balance %d, want %d", b, pointsFor(msg))
			}
			if n := count(t, db, "SELECT count(*) FROM "+f.q+".escaped"); n != 5 {
				t.Errorf("%d notes, want 5", n)
			}
		})
	}
}

// OpenGuarded opens by driver name with the guard in place.
func TestOpenGuarded(t *testing.T) {
	t.Parallel()
	if pgDSN == "" {
		t.Skip(skipReason)
	}
	for _, name := range []string{"postgres", "pgx"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db, err := idempotent.OpenGuarded(name, pgDSN)
			if err != nil {
				t.Fatal(err)
			}
			db.SetMaxOpenConns(3)
			t.Cleanup(func() { closeChecked(t, db) })
			f := newGuardFixture(t, db)
			msg := orderCompleted{OrderID: 6, CustomerID: 6, TotalCents: 600}
			_, err = f.mw.ProcessMessage(context.Background(), idempotent.Message{Key: msg.key()}, func(ctx context.Context, tx *sql.Tx) error {
				_, err := db.ExecContext(ctx, "INSERT INTO "+f.q+".escaped VALUES ('x')")
				return err
			})
			if !errors.Is(err, idempotent.ErrAutocommit) {
				t.Fatalf("Process: %v, want ErrAutocommit", err)
			}
			f.assertNothingWritten(t, msg.key(), msg.CustomerID)
		})
	}
	if _, err := idempotent.OpenGuarded("no-such-driver", pgDSN); err == nil {
		t.Error("OpenGuarded with an unknown driver succeeded")
	}
}

// A handler that swallows the guard's error and then fails for another
// reason gets both: its own error and ErrAutocommit.
func TestGuardViolationAndOtherFailure(t *testing.T) {
	t.Parallel()
	db := openGuarded(t, "pq", 3)
	f := newGuardFixture(t, db)
	errOwn := errors.New("handler's own failure")
	_, err := f.mw.ProcessMessage(context.Background(), idempotent.Message{Key: "k"}, func(ctx context.Context, tx *sql.Tx) error {
		_, _ = db.ExecContext(ctx, "INSERT INTO "+f.q+".escaped VALUES ('x')")
		return errOwn
	})
	if !errors.Is(err, idempotent.ErrAutocommit) || !errors.Is(err, errOwn) {
		t.Fatalf("Process: %v, want both ErrAutocommit and the handler's error", err)
	}
	f.assertNothingWritten(t, "k", 1)
}
