package adapter

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
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
	if err := refuseOrdered(msg); err != nil {
		return false, err
	}
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
		if err := refuseOrdered(m); err != nil {
			return nil, &idempotent.BatchKeyError{Index: i, Err: err}
		}
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

// Coalesced returns the Path's coalesced deliveries, with companion as the
// adapter's own writes for each group, when the Middleware was created
// with idempotent.WithCoalescing; false otherwise (or when companion is
// nil). companion runs in each transaction of a group, after its claims
// and handlers, with the items (Coalesced.Process) of the members that did
// not fail, in the order the group claimed them; it returns, per item,
// nil or the error that fails that delivery alone (failed may be nil), or
// an error of the transaction. Its writes commit even when every member
// of the group was a duplicate. ready, when not nil, says how many
// deliveries may join a group at the moment (the adapter's workers that
// have a message to deliver): a group then closes as soon as it has that
// many, without waiting out Wait; call Coalesced.Flush when that count
// drops.
func (p *Path) Coalesced(companion func(ctx context.Context, tx *sql.Tx, items []any) (failed []error, err error), ready func() int) (*Coalesced, bool) {
	if companion == nil {
		return nil, false
	}
	c, ok := p.p.Coalescer(companion, ready)
	if !ok {
		return nil, false
	}
	return &Coalesced{c: c}, true
}

// Coalesced is a Path's deliveries coalesced as the Middleware's
// WithCoalescing coalesces ProcessMessage calls: concurrent deliveries
// share one transaction — up to Max, closing Wait after the first — each
// message claimed just before its handler runs on its own caller's
// goroutine, one after the other, then the group's companion, and one
// COMMIT. A handler's failure fails its own delivery only; a failure of
// the transaction itself is retried for the whole group under the retry
// policy. Its groups hold only its own deliveries.
type Coalesced struct{ c claimfold.Coalescer }

// Process runs one delivery of msg in a coalesced group: item goes to the
// group's companion, and fn, the handler, runs in the group's transaction
// when msg's claim is new. A delivery that is alone in its group, or that
// the group's claim could not claim (a busy key, a missing partition, the
// retention fence), runs alone, as Path.Process runs it with alone as the
// body. It reports whether the handler ran in the transaction that
// committed. Errors are wrapped as ProcessMessage wraps them.
func (c *Coalesced) Process(ctx context.Context, msg idempotent.Message, item any, fn func(ctx context.Context, tx *sql.Tx) error, alone func(ctx context.Context, a *Attempt) error) (applied bool, err error) {
	if alone == nil {
		return false, errors.New("adapter: Coalesced.Process: nil alone")
	}
	if err := refuseOrdered(msg); err != nil {
		return false, err
	}
	return c.c.Process(ctx, msg.Key, msg.EventTime, item, fn, func(ctx context.Context, a claimfold.Attempt) error {
		return alone(ctx, &Attempt{a: a})
	})
}

// Flush closes the group open for members if it has as many as the ready
// function given to Path.Coalesced says may join: call it when that count
// drops, so that the members waiting do not wait out Wait for one that
// will not come.
func (c *Coalesced) Flush() { c.c.Flush() }

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

// refuseOrdered refuses a message with an ordering key or sequence: a
// Path's claims keep no per-key order (idempotent.WithOrdering is
// ProcessMessage's), and applying it unchecked would apply it out of order.
func refuseOrdered(msg idempotent.Message) error {
	if msg.OrderKey == "" && msg.OrderSeq == 0 {
		return nil
	}
	return fmt.Errorf("%w: key %q: a Path keeps no per-key order; process ordered messages with the Middleware's ProcessMessage", idempotent.ErrInvalidOrder, msg.Key)
}
