package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/mysql"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/sqlite"
)

// EnsureSchema on every start, while other processes claim (issue 20, case
// 7), against each real database.

// schemaDB is one database under the EnsureSchema tests.
type schemaDB struct {
	name string
	d    dialect.Dialect
	// open returns a new pool on the database: one process's. single caps
	// it at one connection, so that session counters read on it are the
	// ones of the connection EnsureSchema used.
	open func(t *testing.T, single bool) *sql.DB
	// table returns a fresh claim table name.
	table func(t *testing.T, admin *sql.DB) string
	// lockWaits, if set, describes the sessions waiting for a lock on the
	// claim table ("" when none is).
	lockWaits func(ctx context.Context, admin *sql.DB, table string) (string, error)
	// ddlCount, if set, counts the DDL statements the pool's one
	// connection has run.
	ddlCount func(t *testing.T, db *sql.DB) int
	// dropIndex is the statement that drops the claim table's processed_at
	// index.
	dropIndex func(table string) string
	// serialWriters: a held claim blocks every other writer anyway
	// (SQLite), so an unrelated key cannot be checked.
	serialWriters bool
}

func schemaDBs(t *testing.T) []schemaDB {
	t.Helper()
	dir := t.TempDir()
	return []schemaDB{
		{
			name: "postgres",
			d:    postgres.New(),
			open: func(t *testing.T, single bool) *sql.DB {
				n := 4
				if single {
					n = 1
				}
				return openGuarded(t, "pq", n)
			},
			table: func(t *testing.T, admin *sql.DB) string { return tempSchema(t, admin) + ".claims" },
			lockWaits: func(ctx context.Context, admin *sql.DB, table string) (string, error) {
				var s string
				err := admin.QueryRowContext(ctx, `SELECT coalesce(string_agg(l.mode || ' by ' || coalesce(a.query, '?'), '; '), '')
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.relation = to_regclass($1) AND NOT l.granted`, table).Scan(&s)
				return s, err
			},
			dropIndex: func(table string) string {
				tb, _ := dialect.ParseTable(table)
				return "DROP INDEX " + pq.QuoteIdentifier(tb.Schema) + "." + pq.QuoteIdentifier(postgres.IndexName(tb.Name))
			},
		},
		{
			name: "mariadb",
			d:    mysql.New(),
			open: func(t *testing.T, single bool) *sql.DB {
				db, err := sql.Open("mysql", mysqlDSN(t))
				return pool(t, db, err, single)
			},
			table: plainTable,
			lockWaits: func(ctx context.Context, admin *sql.DB, table string) (string, error) {
				var s string
				err := admin.QueryRowContext(ctx, `SELECT COALESCE(GROUP_CONCAT(CONCAT(STATE, ' by ', LEFT(INFO, 80)) SEPARATOR '; '), '')
FROM information_schema.PROCESSLIST
WHERE STATE LIKE 'Waiting for%lock%' AND INFO LIKE CONCAT('%', ?, '%')`, table).Scan(&s)
				return s, err
			},
			ddlCount: func(t *testing.T, db *sql.DB) int {
				var n int
				if err := db.QueryRow(`SELECT COALESCE(SUM(VARIABLE_VALUE), 0) FROM information_schema.SESSION_STATUS
WHERE VARIABLE_NAME IN ('COM_CREATE_TABLE', 'COM_CREATE_INDEX', 'COM_ALTER_TABLE')`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			},
			dropIndex: func(table string) string { return "DROP INDEX " + table + "_processed_at ON " + table },
		},
		{
			name: "sqlite",
			d:    sqlite.New(),
			open: func(t *testing.T, single bool) *sql.DB {
				// A short busy timeout: a process whose EnsureSchema
				// waits for the write lock gives up soon.
				db, err := sql.Open(sqlite.DriverName, "file:"+filepath.Join(dir, "schema.db")+"?_pragma=busy_timeout(200)&_pragma=journal_mode(WAL)&_txlock=immediate")
				return pool(t, db, err, single)
			},
			table:         plainTable,
			dropIndex:     func(table string) string { return "DROP INDEX " + table + "_processed_at" },
			serialWriters: true,
		},
	}
}

// ensured opens the first process's pool, names a fresh claim table and
// returns a Middleware on it with the schema ensured.
func (s schemaDB) ensured(t *testing.T) (*sql.DB, string, *idempotent.Middleware) {
	t.Helper()
	admin := s.open(t, false)
	table := s.table(t, admin)
	mw, err := idempotent.New(admin, s.d, "loyalty", idempotent.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return admin, table, mw
}

// pool caps the opened db at one connection when single, and closes it at
// the end of t.
func pool(t *testing.T, db *sql.DB, err error, single bool) *sql.DB {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if single {
		db.SetMaxOpenConns(1)
	}
	t.Cleanup(func() { closeChecked(t, db) })
	return db
}

// plainTable returns a fresh table name in the connection's database,
// dropped at the end of t.
func plainTable(t *testing.T, admin *sql.DB) string {
	name := uniqueName("t")
	t.Cleanup(func() { _, _ = admin.Exec("DROP TABLE IF EXISTS " + name) })
	return name
}

// heldClaim runs a ProcessMessage of msg on mw whose handler holds the
// claim's transaction open until release is called; it returns once the
// claim is inserted. release returns the delivery's result. The claim is
// released at the end of the test in any case.
func heldClaim(t *testing.T, mw *idempotent.Middleware, msg idempotent.Message) (release func() (idempotent.Outcome, error)) {
	t.Helper()
	claimed, free := make(chan struct{}), make(chan struct{})
	type result struct {
		out idempotent.Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := mw.ProcessMessage(context.Background(), msg, func(context.Context, *sql.Tx) error {
			close(claimed)
			<-free
			return nil
		})
		done <- result{out, err}
	}()
	select {
	case <-claimed:
	case r := <-done:
		t.Fatalf("delivery of %q ended before its handler ran: %v, %v", msg.Key, r.out, r.err)
	}
	released := false
	release = func() (idempotent.Outcome, error) {
		if !released {
			released = true
			close(free)
		}
		r := <-done
		done <- r
		return r.out, r.err
	}
	t.Cleanup(func() { _, _ = release() })
	return release
}

// returnsOrWaits waits until done yields an error or, where the database
// can tell, a session waits for a lock on the claim table; it then returns
// the error (nil while it is still running) and a description of the
// waits ("" when done came first). The poll is a condition, not a delay:
// the outcome does not depend on how long either takes.
func returnsOrWaits(t *testing.T, s schemaDB, admin *sql.DB, table string, done <-chan error) (err error, finished bool, waits string) {
	t.Helper()
	if s.lockWaits == nil {
		return <-done, true, ""
	}
	for {
		select {
		case err := <-done:
			return err, true, ""
		default:
		}
		w, qerr := s.lockWaits(context.Background(), admin, table)
		if qerr != nil {
			t.Fatalf("look for lock waits: %v", qerr)
		}
		if w != "" {
			return nil, false, w
		}
		select {
		case err := <-done:
			return err, true, ""
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// TestEnsureSchemaBehindAnOpenClaim: while a handler holds a claim open, a
// second process's EnsureSchema of the complete schema returns without
// waiting and sends no DDL, and an unrelated key's Process is not held up
// by it.
func TestEnsureSchemaBehindAnOpenClaim(t *testing.T) {
	for _, s := range schemaDBs(t) {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			admin, table, mw := s.ensured(t)
			release := heldClaim(t, mw, idempotent.Message{Key: "held"})

			// A second process starts.
			other := s.open(t, true)
			var before int
			if s.ddlCount != nil {
				before = s.ddlCount(t, other)
			}
			starting, err := idempotent.NewClaimTable(other, s.d, idempotent.WithTable(table))
			if err != nil {
				t.Fatal(err)
			}
			ensured := make(chan error, 1)
			go func() { ensured <- starting.EnsureSchema(ctx) }()
			err, finished, waits := returnsOrWaits(t, s, admin, table, ensured)
			switch {
			case !finished:
				t.Errorf("EnsureSchema waits for a lock on %s behind the open claim: %s", table, waits)
			case err != nil:
				t.Errorf("EnsureSchema behind an open claim: %v", err)
			case s.ddlCount != nil:
				if n := s.ddlCount(t, other) - before; n != 0 {
					t.Errorf("EnsureSchema of a complete schema sent %d DDL statements, want none", n)
				}
			}

			if !s.serialWriters {
				// A claim of another key, while the first is held (and,
				// if it has not returned, while EnsureSchema waits).
				applied := make(chan error, 1)
				go func() {
					out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "unrelated"}, func(context.Context, *sql.Tx) error { return nil })
					if err == nil && out != idempotent.Applied {
						err = fmt.Errorf("outcome %v, want applied", out)
					}
					applied <- err
				}()
				err, done, waits := returnsOrWaits(t, s, admin, table, applied)
				switch {
				case !done:
					t.Errorf("Process of an unrelated key waits for a lock on %s: %s", table, waits)
				case err != nil:
					t.Errorf("Process of an unrelated key: %v", err)
				}
				if !done {
					defer func() {
						if err := <-applied; err != nil {
							t.Errorf("Process of an unrelated key, after the claim was released: %v", err)
						}
					}()
				}
			}
			if out, err := release(); err != nil || out != idempotent.Applied {
				t.Errorf("held delivery = %v, %v; want applied", out, err)
			}
			if !finished {
				t.Logf("EnsureSchema, once the claim was released: %v", <-ensured)
			}
		})
	}
}

// TestEnsureSchemaGivesUpBehindAnOpenClaim: a missing processed_at index,
// which EnsureSchema must create while a handler holds a claim on the
// table, makes it give up waiting for the lock with ErrSchemaLockTimeout,
// saying it is safe to retry; it creates the index once the claim has
// ended.
func TestEnsureSchemaGivesUpBehindAnOpenClaim(t *testing.T) {
	for _, s := range schemaDBs(t) {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			admin, table, mw := s.ensured(t)
			if _, err := admin.Exec(s.dropIndex(table)); err != nil {
				t.Fatal(err)
			}
			release := heldClaim(t, mw, idempotent.Message{Key: "held"})

			other := s.open(t, true)
			starting, err := idempotent.NewClaimTable(other, s.d, idempotent.WithTable(table))
			if err != nil {
				t.Fatal(err)
			}
			// A bound on a hang, not a timing assertion: EnsureSchema
			// gives up after PartitionLockTimeout, or at this deadline if
			// nothing bounds its wait.
			wctx, cancel := context.WithTimeout(ctx, 4*idempotent.PartitionLockTimeout)
			defer cancel()
			err = starting.EnsureSchema(wctx)
			if !errors.Is(err, idempotent.ErrSchemaLockTimeout) {
				t.Errorf("EnsureSchema creating an index behind an open claim = %v, want ErrSchemaLockTimeout", err)
			} else {
				for _, says := range []string{"gave up waiting for the lock on claim table " + table, "to create index ", "safe to retry"} {
					if !strings.Contains(err.Error(), says) {
						t.Errorf("error %q does not say %q", err, says)
					}
				}
				t.Logf("EnsureSchema: %v", err)
			}
			if errors.Is(err, idempotent.ErrRetriesExhausted) {
				t.Errorf("EnsureSchema retried its lock wait: %v; giving up is final, the caller runs it again", err)
			}
			if s.name == "mariadb" {
				// The DDL's lock_wait_timeout died with its connection.
				var session, global int
				if err := other.QueryRow("SELECT @@SESSION.lock_wait_timeout, @@GLOBAL.lock_wait_timeout").Scan(&session, &global); err != nil {
					t.Fatal(err)
				}
				if session != global {
					t.Errorf("the pool's connection has lock_wait_timeout %d, the server's is %d: the DDL's setting leaked", session, global)
				}
			}
			if out, err := release(); err != nil || out != idempotent.Applied {
				t.Errorf("held delivery = %v, %v; want applied", out, err)
			}
			if err := starting.EnsureSchema(ctx); err != nil {
				t.Fatalf("EnsureSchema once the claim ended: %v", err)
			}
			insp, ok := s.d.(dialect.SchemaInspector)
			if !ok {
				t.Fatalf("the %s dialect is not a dialect.SchemaInspector", s.d.Name())
			}
			tb, _ := dialect.ParseTable(table)
			for _, o := range insp.SchemaObjects(tb, false) {
				q, args := insp.ObjectExistsSQL(o)
				var ok bool
				if err := admin.QueryRow(q, args...).Scan(&ok); err != nil || !ok {
					t.Errorf("after EnsureSchema, %v exists = %v, %v", o, ok, err)
				}
			}
		})
	}
}

// TestEnsureSchemaPartitionGivesUpBehindAnOpenClaim: in partitioned mode,
// a missing day's partition, which EnsureSchema creates while a claim is
// held (CREATE TABLE … PARTITION OF locks the parent), gives up the same
// way.
func TestEnsureSchemaPartitionGivesUpBehindAnOpenClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := openGuarded(t, "pq", 4)
	table := tempSchema(t, admin) + ".claims"
	opts := []idempotent.TableOption{idempotent.WithTable(table), idempotent.WithDailyPartitions(2)}
	mw, err := idempotent.New(admin, postgres.New(), "loyalty", options(opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	parts, err := mw.ClaimTable().Partitions(ctx)
	if err != nil || len(parts) < 2 {
		t.Fatalf("partitions %v, %v", parts, err)
	}
	last := parts[len(parts)-1]
	tb, _ := dialect.ParseTable(table)
	if _, err := admin.Exec("DROP TABLE " + pq.QuoteIdentifier(tb.Schema) + "." + pq.QuoteIdentifier(last.Name)); err != nil {
		t.Fatal(err)
	}
	release := heldClaim(t, mw, idempotent.Message{Key: "held", EventTime: time.Now()})
	other := openGuarded(t, "pq", 1)
	starting, err := idempotent.NewClaimTable(other, postgres.New(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 4*idempotent.PartitionLockTimeout)
	defer cancel()
	err = starting.EnsureSchema(wctx)
	if out, err := release(); err != nil || out != idempotent.Applied {
		t.Errorf("held ProcessMessage = %v, %v; want applied", out, err)
	}
	if !errors.Is(err, idempotent.ErrSchemaLockTimeout) || !strings.Contains(err.Error(), "to create a partition") || !strings.Contains(err.Error(), "safe to retry") {
		t.Errorf("EnsureSchema creating a partition behind an open claim = %v, want ErrSchemaLockTimeout saying it is safe to retry", err)
	} else {
		t.Logf("EnsureSchema: %v", err)
	}
	if err := starting.EnsureSchema(ctx); err != nil {
		t.Fatalf("EnsureSchema once the claim ended: %v", err)
	}
	if now, err := starting.Partitions(ctx); err != nil || len(now) != len(parts) {
		t.Errorf("partitions after EnsureSchema: %v, %v; want %d", now, err, len(parts))
	}
}
