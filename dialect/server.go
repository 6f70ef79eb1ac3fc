package dialect

import (
	"context"
	"errors"
)

// ErrWrongDatabase is returned, wrapped, by [ServerChecker.CheckServer] when
// the database behind a *sql.DB is not one the dialect speaks: for example
// the MySQL dialect given a *sql.DB opened with a Postgres driver.
var ErrWrongDatabase = errors.New("dialect does not match the database")

// QueryFunc runs query with args and returns the first column of its only
// row as a string ("" for NULL), or sql.ErrNoRows when there is no row. The
// middleware passes one that runs on the transaction EnsureSchema opened.
type QueryFunc func(ctx context.Context, query string, args ...any) (string, error)

// ServerChecker is an optional interface of a [Dialect]. A dialect that
// implements it verifies, before its schema statements run, that the
// database is one it speaks and is set up as it needs (the MySQL dialect,
// for instance, requires InnoDB). The middleware calls it from
// EnsureSchema, so a dialect used with the wrong driver fails there with an
// error naming the mismatch instead of a syntax error from the server.
//
// CheckServer may run a few cheap queries through q. It returns nil, or an
// error that wraps [ErrWrongDatabase] when the database is of another kind,
// and names what it found. A query that the database cannot even parse is a
// mismatch too: the error says so and wraps the database's own error.
type ServerChecker interface {
	CheckServer(ctx context.Context, t Table, q QueryFunc) error
}
