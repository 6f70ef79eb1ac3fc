package idempotent

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/txclaim/idempotent/dialect"
)

// NaturalFunc applies an effect whose own unique key is the idempotency
// record, and reports whether it took effect. The usual shape is the guide's
// Step 4: an INSERT … ON CONFLICT DO NOTHING on the business table, whose
// rows affected (or RETURNING) say whether the message was new.
type NaturalFunc func(ctx context.Context, tx *sql.Tx) (applied bool, err error)

// ProcessNatural runs fn in a transaction with the middleware's isolation
// level, retries, guard and observer, but without the claim table: fn's own
// conflict-free insert on a natural key (one ledger row per order, say) is
// what makes a redelivery harmless. It returns Applied when fn reports that
// its effect took place and Duplicate when not; the transaction commits
// either way. key identifies the message to the observer and in errors, and
// is validated like Process's. WithStrictGuard applies here too: the
// transaction id is read before fn runs and checked before COMMIT.
//
// Natural keys on business tables never expire, so they cover replays of any
// age: prefer them for money.
func (m *Middleware) ProcessNatural(ctx context.Context, key string, fn NaturalFunc) (Outcome, error) {
	if fn == nil {
		return 0, errors.New("idempotent: ProcessNatural: nil function")
	}
	return m.observe(ctx, key, func(ctx context.Context) (Outcome, int, error) {
		if err := validateKey(key, m.maxKey); err != nil {
			return 0, 0, err
		}
		var outcome Outcome
		attempts, err := m.run.run(ctx, key, func(ctx context.Context, tx *sql.Tx, st *attemptState) error {
			if err := m.captureTxID(ctx, tx, st); err != nil {
				return err
			}
			st.inHandler = true
			applied, err := fn(ctx, tx)
			outcome = Duplicate
			if applied {
				outcome = Applied
			}
			return err
		})
		if err != nil {
			return 0, attempts, fmt.Errorf("idempotent: consumer %q, key %q: %w", m.consumer, key, err)
		}
		return outcome, attempts, nil
	})
}

// VersionedUpsert describes a version-guarded upsert: last-writer-wins by
// version, for state that a message replaces rather than adds to (a
// projection of an order's status, say). Redelivered and out-of-order
// messages are harmless without any claim: an older or equal version changes
// nothing.
type VersionedUpsert struct {
	// Table is "table" or "schema.table".
	Table string
	// Key lists the columns of the unique key identifying the row.
	Key []string
	// Version is the column holding the version; it must be comparable with <.
	Version string
	// Columns lists the other columns written.
	Columns []string
}

// Upsert is a prepared version-guarded upsert. It is safe for concurrent use.
type Upsert struct {
	sql  string
	args int
}

// Execer runs a statement: *sql.DB, *sql.Tx and *sql.Conn all are.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// NewVersionedUpsert checks u and builds its statement for dialect d, which
// must implement dialect.Upserter.
func NewVersionedUpsert(d dialect.Dialect, u VersionedUpsert) (*Upsert, error) {
	up, ok := d.(dialect.Upserter)
	if !ok {
		return nil, fmt.Errorf("idempotent: the %s dialect has no version-guarded upsert", d.Name())
	}
	t, err := dialect.ParseTable(u.Table)
	if err != nil {
		return nil, fmt.Errorf("idempotent: versioned upsert: %w", err)
	}
	if len(u.Key) == 0 {
		return nil, errors.New("idempotent: versioned upsert: no key columns")
	}
	seen := map[string]bool{}
	for _, c := range append(append(append([]string{}, u.Key...), u.Version), u.Columns...) {
		if err := dialect.CheckIdentifier(c); err != nil {
			return nil, fmt.Errorf("idempotent: versioned upsert on %s: column: %w", t, err)
		}
		if seen[c] {
			return nil, fmt.Errorf("idempotent: versioned upsert on %s: column %q is listed twice", t, c)
		}
		seen[c] = true
	}
	return &Upsert{sql: up.VersionedUpsertSQL(t, u.Key, u.Version, u.Columns), args: len(seen)}, nil
}

// SQL returns the statement.
func (u *Upsert) SQL() string { return u.sql }

// Exec runs the upsert on x (normally the handler's *sql.Tx) with values for
// the key columns, the version and the other columns, in that order. It
// reports applied when the row was inserted or replaced, and false when the
// stored version was equal or newer.
func (u *Upsert) Exec(ctx context.Context, x Execer, values ...any) (applied bool, err error) {
	if len(values) != u.args {
		return false, fmt.Errorf("idempotent: versioned upsert: %d values, want %d (key columns, version, other columns)", len(values), u.args)
	}
	res, err := x.ExecContext(ctx, u.sql, values...)
	if err != nil {
		return false, fmt.Errorf("idempotent: versioned upsert: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("idempotent: versioned upsert: rows affected: %w", err)
	}
	return n > 0, nil
}
