package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// DriverName is the database/sql driver name that modernc.org/sqlite
// registers, and that this package's import makes available.
const DriverName = "sqlite"

// BusyTimeout is how long a connection opened by [Open] or [DSN] waits for
// another writer before failing with SQLITE_BUSY (which the middleware
// retries).
const BusyTimeout = 5 * time.Second

// DSN returns the data source name that [Open] uses for the database file
// at path: WAL journal, busy_timeout of [BusyTimeout], synchronous=FULL and
// immediate transactions (see the package documentation). Use it to open
// the database another way, for example with the autocommit guard:
//
//	dsn, err := sqlite.DSN(path)
//	db, err := idempotent.OpenGuarded(sqlite.DriverName, dsn)
//
// path must name a file; "" and ":memory:" are refused, because every
// pooled connection would get a database of its own.
func DSN(path string) (string, error) {
	switch {
	case path == "":
		return "", errors.New("sqlite: empty database path")
	case path == ":memory:" || strings.HasPrefix(path, "file::memory:"):
		return "", fmt.Errorf("sqlite: %q is an in-memory database, private to each pooled connection: use a file", path)
	case strings.HasPrefix(path, "file:"):
		return "", fmt.Errorf("sqlite: %q is a URI: give a plain file path, the settings are added by DSN", path)
	case strings.ContainsRune(path, 0):
		return "", fmt.Errorf("sqlite: database path %q contains a NUL byte", path)
	}
	// The file: URI form lets any path through: '%', '?' and '#' are escaped
	// for SQLite's URI parser, which unescapes them.
	esc := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
	params := []string{
		fmt.Sprintf("_pragma=busy_timeout(%d)", BusyTimeout.Milliseconds()),
		"_pragma=journal_mode(WAL)",
		"_pragma=synchronous(FULL)",
		"_txlock=immediate",
	}
	return "file:" + esc + "?" + strings.Join(params, "&"), nil
}

// Open opens (creating if needed) the SQLite database file at path with the
// settings of [DSN], checks that it answers and is in WAL mode, and returns
// it. Close it when done.
func Open(path string) (*sql.DB, error) {
	dsn, err := DSN(path)
	if err != nil {
		return nil, err
	}
	db, err := sql.Open(DriverName, dsn)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), BusyTimeout+5*time.Second)
	defer cancel()
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	if !strings.EqualFold(mode, "wal") {
		_ = db.Close()
		return nil, fmt.Errorf("sqlite: open %s: journal_mode is %q, not wal (a read-only or special file?)", path, mode)
	}
	return db, nil
}
