package idempotent

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/txclaim/idempotent/dialect"
)

// ErrSchemaLockTimeout reports that EnsureSchema gave up waiting for a lock
// on the claim table that its DDL needed (to create an index or a
// partition): another transaction, such as a claim whose handler was still
// running, held the table for longer than PartitionLockTimeout, and every
// new claim would have queued behind a longer wait. The transaction that
// waited was rolled back; EnsureSchema is safe to run again.
var ErrSchemaLockTimeout = errors.New("idempotent: gave up waiting for the lock on claim table")

// checkSchema runs the server check and probe and reads the catalog, in a
// read-only transaction, which on every dialect begins without a write
// lock and takes no lock on the claim table. It returns the objects that
// are missing.
func (t *ClaimTable) checkSchema(ctx context.Context, insp dialect.SchemaInspector, objs []dialect.SchemaObject, probe func(context.Context, *sql.Tx) error) ([]dialect.SchemaObject, error) {
	checker, _ := t.d.(dialect.ServerChecker)
	r := runner{db: t.db, d: t.d, txOpts: &sql.TxOptions{ReadOnly: true}, policy: t.policy}
	var missing []dialect.SchemaObject
	_, err := r.run(ctx, "", func(ctx context.Context, tx *sql.Tx, _ *attemptState) error {
		missing = missing[:0]
		if err := t.checkServer(ctx, tx, checker, probe); err != nil {
			return err
		}
		for _, o := range objs {
			ok, err := objectExists(ctx, tx, insp, o)
			if err != nil {
				return fmt.Errorf("look for %v: %w", o, err)
			}
			if !ok {
				missing = append(missing, o)
			}
		}
		return nil
	})
	return missing, err
}

// createMissing creates, in one transaction under the dialect's schema lock
// and DDL lock timeout, each object the catalog still says is missing. A
// DDL lock timeout is final, not retried: it means a claim holds the table.
func (t *ClaimTable) createMissing(ctx context.Context, insp dialect.SchemaInspector, objs, missing []dialect.SchemaObject) error {
	lockSQL := insp.SchemaLockSQL(t.table)
	timeoutSQL, session := insp.DDLLockTimeoutSQL(PartitionLockTimeout)
	r := runner{db: t.db, d: ddlDialect{Dialect: t.d, insp: insp}, policy: t.policy}
	if session {
		// The lock timeout is a setting of the session: each attempt runs
		// on a connection of its own, which is then closed rather than
		// returned to the pool with the setting.
		var conn *sql.Conn
		discard := func() {
			if conn != nil {
				_ = conn.Raw(func(any) error { return driver.ErrBadConn })
				_ = conn.Close()
				conn = nil
			}
		}
		defer discard()
		r.begin = func(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*sql.Tx, error) {
			discard()
			c, err := db.Conn(ctx)
			if err != nil {
				return nil, err
			}
			conn = c
			return c.BeginTx(ctx, opts)
		}
	}
	// doing is what the transaction was doing when it failed; a wait at
	// its begin (SQLite's) is a wait to create the first missing object.
	doing := "create " + missing[0].String()
	_, err := r.run(ctx, "", func(ctx context.Context, tx *sql.Tx, _ *attemptState) error {
		if lockSQL != "" {
			doing = "take the schema lock"
			if _, err := tx.ExecContext(ctx, lockSQL); err != nil {
				return err
			}
		}
		if timeoutSQL != "" {
			if _, err := tx.ExecContext(ctx, timeoutSQL); err != nil {
				return err
			}
		}
		for _, o := range objs {
			ok, err := objectExists(ctx, tx, insp, o)
			if err != nil {
				return fmt.Errorf("look for %v: %w", o, err)
			}
			if ok {
				continue
			}
			doing = "create " + o.String()
			if _, err := tx.ExecContext(ctx, o.CreateSQL); err != nil {
				// Another process may have created it meanwhile, on a
				// database without a schema lock. (Where the failure
				// aborted the transaction, the look fails and the
				// failure stands.)
				if ok, lerr := objectExists(ctx, tx, insp, o); lerr == nil && ok {
					continue
				}
				return fmt.Errorf("create %v: %w", o, err)
			}
		}
		doing = "commit what it created"
		return nil
	})
	if err == nil {
		return nil
	}
	if insp.IsDDLLockTimeout(err) {
		wait := PartitionLockTimeout.String()
		if timeoutSQL == "" {
			wait = busyTimeout
		}
		return t.schemaLockError(doing, wait, err)
	}
	return fmt.Errorf("idempotent: ensure schema of %s: %w", t.table, err)
}

// ddlDialect is the dialect of the transaction that creates what is
// missing: a lock wait that gave up is final there (KindLockTimeout), also
// where the dialect otherwise retries it (SQLite's SQLITE_BUSY).
type ddlDialect struct {
	dialect.Dialect
	insp dialect.SchemaInspector
}

func (d ddlDialect) Classify(err error) dialect.Class {
	c := d.Dialect.Classify(err)
	if err != nil && d.insp.IsDDLLockTimeout(err) {
		c.Kind = dialect.KindLockTimeout
	}
	return c
}

// checkServer runs the dialect's server check, if it has one, and probe,
// if set, on tx.
func (t *ClaimTable) checkServer(ctx context.Context, tx *sql.Tx, checker dialect.ServerChecker, probe func(context.Context, *sql.Tx) error) error {
	if checker != nil {
		if err := checker.CheckServer(ctx, t.table, txQuery(tx)); err != nil {
			return err
		}
	}
	if probe != nil {
		return probe(ctx, tx)
	}
	return nil
}

func objectExists(ctx context.Context, tx *sql.Tx, insp dialect.SchemaInspector, o dialect.SchemaObject) (bool, error) {
	q, args := insp.ObjectExistsSQL(o)
	var ok bool
	err := tx.QueryRowContext(ctx, q, args...).Scan(&ok)
	return ok, err
}

// schemaLockError is the error of EnsureSchema when it gave up waiting, for
// wait, for a lock it needed to do what. Unless the wait was a busy
// timeout (SQLite's, where a waiting writer holds nothing up), new claims
// queued behind the wait.
func (t *ClaimTable) schemaLockError(what, wait string, err error) error {
	queued := ", while new claims queued behind the wait"
	if wait == busyTimeout {
		queued = ""
	}
	return fmt.Errorf("%w %s: to %s, EnsureSchema waited %s for the lock, which another transaction (a claim whose handler is still running, say) holds%s; nothing is left half done, and EnsureSchema is safe to retry: %w",
		ErrSchemaLockTimeout, t.table, what, wait, queued, err)
}

// busyTimeout is the wait of a dialect whose DDL has no lock timeout of its
// own.
const busyTimeout = "the connection's busy timeout"

// ensureSchemaBlind is EnsureSchema for a dialect that cannot read its
// catalog (no dialect.SchemaInspector): its SchemaSQL runs every time, in
// one transaction, as the dialect wrote it.
func (t *ClaimTable) ensureSchemaBlind(ctx context.Context, probe func(context.Context, *sql.Tx) error) error {
	stmts := t.schemaSQL()
	checker, _ := t.d.(dialect.ServerChecker)
	// The schema's own DDL runs in this transaction, so the guard's
	// implicit-commit check (a handler's concern) is left out.
	r := runner{db: t.db, d: t.d, policy: t.policy}
	_, err := r.run(ctx, "", func(ctx context.Context, tx *sql.Tx, _ *attemptState) error {
		if err := t.checkServer(ctx, tx, checker, probe); err != nil {
			return err
		}
		for _, s := range stmts {
			if _, err := tx.ExecContext(ctx, s); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("idempotent: ensure schema of %s: %w", t.table, err)
	}
	return t.afterSchema(ctx)
}
