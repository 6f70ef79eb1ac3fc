package dialect

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Upserter is implemented by dialects that can build a version-guarded
// upsert: insert a row, or update the existing row with the same key only if
// the new version is greater. It is optional; NewVersionedUpsert reports an
// error for a dialect without it.
type Upserter interface {
	// VersionedUpsertSQL returns a statement taking, as parameters in this
	// order, the key columns, the version column and the other columns. It
	// affects one row when it inserted or updated, and none when the stored
	// version is equal or greater (a stale or repeated message). All names
	// have passed CheckIdentifier; the dialect quotes them.
	VersionedUpsertSQL(t Table, key []string, version string, columns []string) string
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
// must implement Upserter. Table and column names must pass CheckIdentifier
// and no column may be listed twice.
func NewVersionedUpsert(d Dialect, u VersionedUpsert) (*Upsert, error) {
	if d == nil {
		return nil, errors.New("versioned upsert: nil dialect")
	}
	up, ok := d.(Upserter)
	if !ok {
		return nil, fmt.Errorf("versioned upsert: the %s dialect has no version-guarded upsert", d.Name())
	}
	t, err := ParseTable(u.Table)
	if err != nil {
		return nil, fmt.Errorf("versioned upsert: %w", err)
	}
	if len(u.Key) == 0 {
		return nil, errors.New("versioned upsert: no key columns")
	}
	seen := map[string]bool{}
	for _, c := range append(append(append([]string{}, u.Key...), u.Version), u.Columns...) {
		if err := CheckIdentifier(c); err != nil {
			return nil, fmt.Errorf("versioned upsert on %s: column: %w", t, err)
		}
		if seen[c] {
			return nil, fmt.Errorf("versioned upsert on %s: column %q is listed twice", t, c)
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
		return false, fmt.Errorf("versioned upsert: %d values, want %d (key columns, version, other columns)", len(values), u.args)
	}
	res, err := x.ExecContext(ctx, u.sql, values...)
	if err != nil {
		return false, fmt.Errorf("versioned upsert: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("versioned upsert: rows affected: %w", err)
	}
	return n > 0, nil
}
