package adapter

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/claimfold"
)

// Path is a Middleware's own delivery path for an adapter whose
// transaction writes something of its own besides the claim and the
// effect — a position it stores in the database, such as the Kafka
// consumer's offsets. Each delivery runs as the Middleware's
// ProcessMessage runs one: the key and event time are checked before any
// transaction; each attempt's transaction begins with the Middleware's
// transaction options; the claim is taken under its lock timeout and
// through its retention fence; with WithStrictGuard the transaction is
// checked after the claim and before COMMIT; serialization failures,
// deadlocks and lost connections are retried under its retry policy; its
// Observer hears the outcome and the retries. Unlike ProcessMessage, the
// Path never consults the duplicate pre-check (WithSeen) nor records into
// it, and an attempt whose claim found a duplicate still commits — the
// adapter's own writes must.
type Path struct{ p claimfold.Path }

// NewPath returns mw's delivery path.
func NewPath(mw *idempotent.Middleware) (*Path, error) {
	if mw == nil {
		return nil, errors.New("adapter: NewPath: nil Middleware")
	}
	p, ok := claimfold.NewPath(mw)
	if !ok {
		return nil, errors.New("adapter: NewPath: the Middleware has no delivery path")
	}
	return &Path{p: p}, nil
}

// DB is the Middleware's database, on which every transaction of the Path
// begins: prepare the statements given to Attempt.Claim there.
func (p *Path) DB() *sql.DB { return p.p.DB() }

// Process runs one delivery of msg. body runs once per attempt: it claims
// exactly once, with Attempt.Claim or Attempt.ClaimAfter, and runs the
// handler with Attempt.Handle only if the claim was new. A nil return
// commits; an error rolls the attempt back. Process reports whether the
// handler ran in the attempt that committed. Errors are wrapped as
// ProcessMessage wraps them.
func (p *Path) Process(ctx context.Context, msg idempotent.Message, body func(ctx context.Context, a *Attempt) error) (applied bool, err error) {
	return p.p.Process(ctx, msg.Key, msg.EventTime, func(ctx context.Context, a claimfold.Attempt) error {
		return body(ctx, &Attempt{a: a})
	})
}

// ProcessBatch is Process for a batch of messages claimed together with
// Attempt.ClaimBatch, as ProcessMessages claims them: in ascending order
// of their keys, a key given twice claimed once. It reports, per message,
// whether the handler applied it. A message that cannot be claimed refuses
// the whole batch before any transaction with an
// *idempotent.BatchKeyError naming its index; so does a batch of more than
// idempotent.MaxBatchSize.
func (p *Path) ProcessBatch(ctx context.Context, msgs []idempotent.Message, body func(ctx context.Context, a *Attempt) error) (applied []bool, err error) {
	keys := make([]string, len(msgs))
	var ats []time.Time
	for i, m := range msgs {
		keys[i] = m.Key
		if !m.EventTime.IsZero() {
			if ats == nil {
				ats = make([]time.Time, len(msgs))
			}
			ats[i] = m.EventTime
		}
	}
	return p.p.ProcessBatch(ctx, keys, ats, func(ctx context.Context, a claimfold.Attempt) error {
		return body(ctx, &Attempt{a: a})
	})
}

// Tx runs body in a transaction of the Middleware's, with its transaction
// options and retry policy, and commits it when body returns nil: for the
// adapter's own writes that need no claim.
func (p *Path) Tx(ctx context.Context, body func(ctx context.Context, tx *sql.Tx) error) error {
	return p.p.Tx(ctx, body)
}

// Attempt is one attempt's transaction of Path.Process or
// Path.ProcessBatch. Its methods must be called from the body it was given
// to, with that body's context.
type Attempt struct{ a claimfold.Attempt }

// Tx is the attempt's transaction.
func (a *Attempt) Tx() *sql.Tx { return a.a.Tx() }

// Claim (Process only) claims with stmt, the prepared Fold's SQL, which
// also runs the companion statement with args, and reports the companion's
// row count and whether the claim was new.
func (a *Attempt) Claim(stmt *sql.Stmt, args ...any) (companion int64, claimed bool, err error) {
	return a.a.Claim(stmt, args...)
}

// ClaimAfter (Process only) runs companion, then the claim statement, and
// reports whether the claim was new: for a dialect that cannot fold, or a
// fold that cannot be prepared.
func (a *Attempt) ClaimAfter(companion func() error) (claimed bool, err error) {
	return a.a.ClaimAfter(companion)
}

// ClaimBatch (ProcessBatch only) runs companion, then claims the batch,
// both under the lock timeout, and returns the indexes, in the batch, of
// the messages whose claims were new, ascending.
func (a *Attempt) ClaimBatch(companion func() error) (fresh []int, err error) {
	return a.a.ClaimBatch(companion)
}

// Handle runs the handler in the attempt's transaction; it may only follow
// a claim that was new. From here on a failure is the handler's, retried
// only when the transaction itself suffered it.
func (a *Attempt) Handle(fn func(ctx context.Context, tx *sql.Tx) error) error {
	return a.a.Handle(fn)
}

// Fold is a Middleware's claim folded with one companion statement of the
// adapter's, so that both run in one round trip to the database.
type Fold struct{ f *claimfold.Fold }

// NewFold folds mw's claim with a companion statement: companion returns
// it with its parameters numbered from first ($first, $first+1, … in
// Postgres). It reports false when the Middleware's dialect cannot fold
// (it has no dialect.ClaimFolder, or refuses these statements): the
// adapter then runs the companion and the claim one after the other
// (Attempt.ClaimAfter).
func NewFold(mw *idempotent.Middleware, companion func(first int) string) (*Fold, bool) {
	f, ok := claimfold.New(mw, companion)
	if !ok {
		return nil, false
	}
	return &Fold{f: f}, true
}

// SQL is the folded statement: prepare it on Path.DB (once per
// connection) and pass it to Attempt.Claim.
func (f *Fold) SQL() string { return f.f.SQL }

// Claim claims msg in tx, exactly as the Middleware's ClaimMessage does —
// the same checks, lock timeout, fence, partition and errors — except that
// the claim statement is stmt, the prepared SQL, which also runs the
// companion with args. It reports the companion's row count and whether
// the claim was new. Like ClaimMessage it neither commits nor retries.
func (f *Fold) Claim(ctx context.Context, tx *sql.Tx, stmt *sql.Stmt, msg idempotent.Message, args ...any) (companion int64, claimed bool, err error) {
	return f.f.Claim(ctx, tx, stmt, msg.Key, msg.EventTime, args...)
}
