package pgxhttp

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idemhttp"
	"github.com/txclaim/idempotent/idempgx"
)

// New returns the Idempotency-Key middleware for the claims of m — its
// claim table, consumer, retry policy and lock timeout — on m's pool, with
// the rules and options of idemhttp.New: scope names the principal of each
// request, m needs idempgx.WithLockTimeout (idemhttp.ErrNoLockTimeout
// otherwise), and a partitioned claim table is refused
// (idemhttp.ErrPartitioned). The handler gets the claim's pgx.Tx from
// TxFromContext.
//
// New sends nothing to the database; call m's EnsureSchema and the
// returned Middleware's before the first request.
func New(m *idempgx.Middleware, scope idemhttp.ScopeFunc, opts ...idemhttp.Option) (*idemhttp.Middleware, error) {
	if m == nil {
		return nil, errors.New("pgxhttp: New needs an idempgx.Middleware")
	}
	return idemhttp.NewOn(backend{m}, scope, opts...)
}

// backend is the idemhttp.Backend of an idempgx.Middleware.
type backend struct{ m *idempgx.Middleware }

func (b backend) Config() idempotent.Config    { return b.m.Config() }
func (b backend) Core() *idempotent.Middleware { return b.m.Core() }

func (b backend) ProcessMessage(ctx context.Context, msg idempotent.Message, fn func(context.Context, idemhttp.Exec) error) (idempotent.Outcome, error) {
	return b.m.ProcessMessage(ctx, msg, func(ctx context.Context, tx pgx.Tx) error {
		// The stored response is queued (idempgx.Queue): it is sent with
		// COMMIT, in the same round trip, after whatever the handler ran or
		// queued. Its failure is the request's, reported when the
		// transaction ends, which then rolls back with the handler's effect.
		return fn(context.WithValue(ctx, txKey{}, tx), func(_ context.Context, q string, args ...any) error {
			return idempgx.Queue(tx, q, args...)
		})
	})
}

// ReadRow reads a row of the response table on the Middleware's pool, in
// one round trip (idemhttp.RowReader).
func (b backend) ReadRow(ctx context.Context, query string, args []any, dest ...any) (bool, error) {
	err := b.m.Pool().QueryRow(ctx, query, args...).Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

type txKey struct{}

// TxFromContext returns the claim's pgx.Tx of a request the middleware of
// New is running, from the request's context: the handler does its
// database work through it (or through sqlc's Queries.WithTx(tx)), with the
// request's context, and that work commits with the claim and the stored
// response, or not at all. Its Commit and Rollback refuse, as idempgx's
// handlers' do. It returns nil for a context the middleware did not give
// (a request of an unprotected method, or one let through by
// idemhttp.WithOptionalKey without a key). idemhttp.KeyFromContext gives
// the claim's key, as on database/sql.
func TxFromContext(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey{}).(pgx.Tx)
	return tx
}
