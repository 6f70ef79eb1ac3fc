package idemhttp

import (
	"context"
	"database/sql"

	"github.com/txclaim/idempotent"
)

// A Backend is the transaction side of a Middleware: it takes a request's
// claim and runs the request in the claim's transaction. The HTTP side —
// key, scope, fingerprint, recording, replay, the 409 and 422 answers,
// the limits — is the Middleware's, the same on every Backend.
//
// New builds the database/sql Backend from an [idempotent.Middleware];
// package github.com/txclaim/idempotent/idemhttp/pgxhttp builds the pgx one
// from an idempgx.Middleware. Backend is exported so that a driver's
// Backend lives in a package of its own, and a service on database/sql
// compiles no pgx; it is not meant as a point of extension. A Backend must
// claim as the idempotent package's Middlewares do: the claim, the
// handler's effect and what fn writes commit together or not at all.
type Backend interface {
	// Config returns the claim's configuration: dialect, consumer, claim
	// table, lock timeout, retention window and clock.
	Config() idempotent.Config
	// Core returns the database/sql Middleware of the same consumer and
	// claim table on the same database: the Middleware checks keys with
	// its CheckMessage and creates, reads and cleans up the response
	// table on its pool.
	Core() *idempotent.Middleware
	// ProcessMessage claims msg and, only if the claim is new, calls fn in
	// the claim's transaction with a context that carries the
	// transaction for the handler (the driver's TxFromContext) and an
	// Exec that runs a statement in it; it then commits and returns
	// idempotent.Applied. It returns idempotent.Duplicate when the claim
	// existed, an error matching idempotent.ErrClaimBusy when it waited
	// past the lock timeout, and fn's error, wrapped, after rolling back.
	ProcessMessage(ctx context.Context, msg idempotent.Message, fn func(ctx context.Context, exec Exec) error) (idempotent.Outcome, error)
}

// RowReader is implemented by a Backend whose driver reads a row faster on
// its own pool than the Core's database/sql pool does (pgxhttp's, on the
// pgxpool): the Middleware then reads stored responses through ReadRow.
// A Backend without it has them read on the Core's pool.
type RowReader interface {
	// ReadRow runs query, a SELECT of at most one row, with args as
	// parameters, outside any transaction, and scans the row into dest.
	// found is false, and err nil, when there is no row.
	ReadRow(ctx context.Context, query string, args []any, dest ...any) (found bool, err error)
}

// Exec runs one statement, with its arguments as parameters, in the
// claim's transaction of a Backend.
type Exec func(ctx context.Context, query string, args ...any) error

// sqlBackend is the database/sql Backend of New.
type sqlBackend struct{ mw *idempotent.Middleware }

func (b sqlBackend) Config() idempotent.Config    { return b.mw.Config() }
func (b sqlBackend) Core() *idempotent.Middleware { return b.mw }

func (b sqlBackend) ProcessMessage(ctx context.Context, msg idempotent.Message, fn func(context.Context, Exec) error) (idempotent.Outcome, error) {
	return b.mw.ProcessMessage(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
		return fn(context.WithValue(ctx, txKey{}, tx), func(ctx context.Context, q string, args ...any) error {
			_, err := tx.ExecContext(ctx, q, args...)
			return err
		})
	})
}

type txKey struct{}

// TxFromContext returns the claim's transaction of a request the middleware
// is running, from the request's context: the handler does its database
// work through it, and that work commits with the claim and the stored
// response, or not at all. It returns nil for a context the middleware did
// not give (a request of an unprotected method, or one let through by
// WithOptionalKey without a key), and for a request of a Middleware on
// another Backend (pgxhttp's handlers use pgxhttp.TxFromContext).
//
// Run statements on it with the request's context (r.Context()), which is
// the claim's: a transaction or a statement begun elsewhere with it is
// refused by the idempotent package's guard (idempotent.ErrAutocommit).
func TxFromContext(ctx context.Context) *sql.Tx {
	tx, _ := ctx.Value(txKey{}).(*sql.Tx)
	return tx
}
