// Package claimfold lets this repository's adapters write something of
// their own — a companion, such as the Kafka consumer's offset advance — in
// the transaction of an idempotent.Middleware's claim, through the
// Middleware's own claim path:
//
//   - a Fold runs the companion in the same statement as the claim, where
//     the Middleware's dialect can fold the two (dialect.ClaimFolder): one
//     round trip to the database instead of two;
//   - a Path runs the whole delivery — begin, companion, claim, handler,
//     commit — as the Middleware's Process does: with its transaction
//     options, retry policy, lock timeout, strict guard and observer.
//
// It is internal on purpose: the hooks reach into the Middleware, and only
// this repository's packages, which know what their companion statements do
// to the claim's transaction, may use them. Package idempotent registers the
// implementation when it is initialised; an adapter that imports idempotent
// can therefore always call New and NewPath.
package claimfold

import (
	"context"
	"database/sql"
	"time"
)

// Fold is a Middleware's claim folded with one companion statement. Its
// zero value is not usable; New returns one.
type Fold struct {
	// SQL is the folded statement. The caller prepares it on the database
	// its transactions come from (once per connection, as a *sql.Stmt of
	// that database) and passes it to Claim or Attempt.Claim.
	SQL string

	claim func(ctx context.Context, tx *sql.Tx, stmt *sql.Stmt, key string, at time.Time, args []any) (int64, bool, error)
}

// Claim claims the message with key and event time at (zero when unknown)
// in tx, exactly as the Middleware's ClaimMessage does — the same checks of
// the key and event time before any statement, the same lock timeout, the
// same claim statement and partition, the same errors — except that the
// claim statement is stmt, the prepared Fold.SQL, which also runs the
// companion with args. It reports the number of rows the companion affected
// and whether the claim was new. Like ClaimMessage it neither commits nor
// retries; an error from stmt leaves tx to be rolled back. An error of the
// statement is wrapped as a claim error even when it concerns the
// companion's table: the caller tells the two apart if it must.
func (f *Fold) Claim(ctx context.Context, tx *sql.Tx, stmt *sql.Stmt, key string, at time.Time, args ...any) (companion int64, claimed bool, err error) {
	return f.claim(ctx, tx, stmt, key, at, args)
}

// Builder builds a Fold for a Middleware. Package idempotent registers it.
type Builder func(mw any, companion func(first int) string) (*Fold, bool)

// PathBuilder builds a Path for a Middleware. Package idempotent registers
// it.
type PathBuilder func(mw any) (Path, bool)

var (
	builder     Builder
	pathBuilder PathBuilder
)

// Register installs package idempotent's builders. Only that package calls
// it, from its init function.
func Register(b Builder, p PathBuilder) { builder, pathBuilder = b, p }

// Make returns a Fold carrying claim, for package idempotent's Builder.
func Make(sql string, claim func(ctx context.Context, tx *sql.Tx, stmt *sql.Stmt, key string, at time.Time, args []any) (int64, bool, error)) *Fold {
	return &Fold{SQL: sql, claim: claim}
}

// New folds mw's claim (mw is an *idempotent.Middleware) with a companion
// statement: companion returns it with its parameters numbered from first
// ($first, $first+1, … in Postgres). It reports false when the Middleware's
// dialect cannot fold (it has no dialect.ClaimFolder, or refuses these
// statements): the caller then runs the companion and the claim one after
// the other (Attempt.ClaimAfter).
func New(mw any, companion func(first int) string) (*Fold, bool) {
	if builder == nil || companion == nil {
		return nil, false
	}
	return builder(mw, companion)
}

// NewPath returns mw's own delivery path (mw is an *idempotent.Middleware),
// or false for anything else.
func NewPath(mw any) (Path, bool) {
	if pathBuilder == nil {
		return nil, false
	}
	return pathBuilder(mw)
}

// Path is a Middleware's own delivery path for a caller whose transaction
// writes something of its own besides the claim and the effect. Each
// delivery runs as the Middleware's ProcessMessage (or ProcessMessages) runs
// one: the key and event time are checked before any transaction; each
// attempt's transaction begins with the Middleware's transaction options
// (WithTxOptions); the claim is taken under its lock timeout
// (WithLockTimeout); with WithStrictGuard the transaction id is read after a
// new claim and checked again before COMMIT and after a handler's failure
// (ErrAutocommit); serialization failures, deadlocks and lost connections
// are retried under its retry policy (WithRetry); its Observer hears the
// outcome and the retries. Unlike ProcessMessage, the Path never consults
// the duplicate pre-check (WithSeen) nor records into it, and an attempt
// whose claim found a duplicate still commits — the caller's companion
// writes must.
type Path interface {
	// DB is the Middleware's database, on which every transaction of the
	// Path begins: prepare the statements given to Attempt.Claim there.
	DB() *sql.DB

	// Process runs one delivery of the message with key and event time at
	// (zero when unknown). body runs once per attempt: it claims exactly
	// once, with Attempt.Claim or Attempt.ClaimAfter, and runs the caller's
	// handler with Attempt.Handle only if the claim was new. A nil return
	// commits; an error rolls the attempt back. Process reports whether the
	// handler ran in the attempt that committed. Errors are wrapped, as
	// ProcessMessage wraps them.
	Process(ctx context.Context, key string, at time.Time, body func(ctx context.Context, a Attempt) error) (applied bool, err error)

	// ProcessBatch is Process for a batch of messages (keys[i] with event
	// time ats[i]; ats may be nil), claimed together with
	// Attempt.ClaimBatch, as ProcessMessages claims them: in ascending
	// order of their keys, a key given twice claimed once. It reports, per
	// message, whether the handler applied it. A message that cannot be
	// claimed refuses the whole batch before any transaction with an
	// *idempotent.BatchKeyError naming its index, as ProcessMessages does;
	// so does a batch of more than idempotent.MaxBatchSize.
	ProcessBatch(ctx context.Context, keys []string, ats []time.Time, body func(ctx context.Context, a Attempt) error) (applied []bool, err error)

	// Tx runs body in a transaction of the Middleware's, with its
	// transaction options and retry policy, and commits it when body
	// returns nil: for the caller's own writes that need no claim.
	Tx(ctx context.Context, body func(ctx context.Context, tx *sql.Tx) error) error

	// Coalescer returns the path's coalesced deliveries with companion,
	// or false when the Middleware was not created WithCoalescing (or
	// companion is nil). ready, when not nil, says how many deliveries
	// may join a group at the moment (the caller's workers that have a
	// message to deliver): a group closes as soon as it has that many
	// members, without waiting out Wait for more (see Coalescer.Flush).
	Coalescer(companion Companion, ready func() int) (Coalescer, bool)
}

// Companion is a caller's own writes for a coalesced group: it runs in
// every transaction of the group, after the claims and handlers, with the
// items of the group's members that did not fail on their own, in the
// order the group claimed them (key order). It returns, for each item,
// nil or the error that fails that member alone (failed may be nil, or
// shorter than items: the rest succeeded) — the group then runs again
// without it — or an error that ends the transaction, which the retry
// policy retries for the whole group when it is retryable. The group's
// transaction commits the companion's writes even when every claim of the
// group was a duplicate.
type Companion func(ctx context.Context, tx *sql.Tx, items []any) (failed []error, err error)

// Coalescer runs a path's deliveries coalesced, as the Middleware's
// WithCoalescing coalesces ProcessMessage calls: concurrent deliveries
// share one transaction (up to Max, closing after Wait), each delivery
// claimed just before its handler runs on its caller's goroutine, the
// group's Companion, one COMMIT. A handler's failure fails its own
// delivery only (the group runs again without it, or, with Savepoints, is
// rolled back to its savepoint), and so does a handler that ends or
// breaks the transaction (ErrAutocommit); a failure of the transaction is
// retried for the group. Its groups hold only this Coalescer's deliveries.
type Coalescer interface {
	// Process runs one delivery of the message with key and event time at,
	// with item given to the group's Companion, and fn as its handler
	// when its claim is new. A delivery that finds itself alone in its
	// group, or whose claim in the group failed for good (a busy key, a
	// missing partition, the retention horizon), runs alone instead,
	// exactly as Path.Process runs body. It reports whether the handler
	// ran in the transaction that committed. Errors are wrapped as
	// ProcessMessage wraps them.
	Process(ctx context.Context, key string, at time.Time, item any, fn func(ctx context.Context, tx *sql.Tx) error, alone func(ctx context.Context, a Attempt) error) (applied bool, err error)

	// Flush closes the group open for members if it has as many as ready
	// says may join: the caller calls it when ready's count drops (a
	// worker ran out of messages), so that the members waiting do not
	// wait out Wait for one that will not come.
	Flush()
}

// Attempt is one attempt's transaction of Path.Process or
// Path.ProcessBatch. Its methods must be called from the body it was given
// to, with that body's context.
type Attempt interface {
	// Tx is the attempt's transaction.
	Tx() *sql.Tx
	// Claim (Process only) claims with stmt, the prepared Fold.SQL, which
	// also runs the companion with args, and reports the companion's row
	// count and whether the claim was new.
	Claim(stmt *sql.Stmt, args ...any) (companion int64, claimed bool, err error)
	// ClaimAfter (Process only) runs companion, then the claim statement,
	// and reports whether the claim was new: for a dialect that cannot
	// fold, or a fold that cannot be prepared.
	ClaimAfter(companion func() error) (claimed bool, err error)
	// ClaimBatch (ProcessBatch only) runs companion, then claims the
	// batch, both under the lock timeout, and returns the indexes, in the
	// batch, of the messages whose claims were new, ascending.
	ClaimBatch(companion func() error) (fresh []int, err error)
	// Handle runs the caller's handler in the attempt's transaction; it
	// may only follow a claim that was new. From here on a failure is the
	// handler's, retried only when the transaction itself suffered it.
	Handle(fn func(ctx context.Context, tx *sql.Tx) error) error
}
