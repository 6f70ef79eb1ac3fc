package brokertest

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

// mistake is something a handler does wrong with the claim's transaction.
type mistake struct {
	name string
	// fatal mistakes end the claim's transaction: the message is
	// dead-lettered with idempotent.ErrAutocommit, nothing of it
	// committed. The others fail the attempt: the message is requeued and
	// applied once later.
	fatal bool
	opts  []idempotent.Option
	do    func(ctx context.Context, tx *sql.Tx) error
}

// mistakes are the handler's mistakes the suite makes, on the first
// delivery of one message among neighbours. A panic is not among them: the
// Middleware rolls back and panics again, the process dies, and
// KillMidHandler covers what the broker then does.
var mistakes = []mistake{
	{name: "ReturnsError", do: func(context.Context, *sql.Tx) error { return errFailOnce }},
	{name: "SwallowsDatabaseError", do: func(ctx context.Context, tx *sql.Tx) error {
		_, _ = tx.ExecContext(ctx, "SELECT 1/0") // the bug: the error ignored, the transaction aborted
		return nil
	}},
	{name: "CancelledContext", do: func(ctx context.Context, tx *sql.Tx) error {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := tx.ExecContext(cctx, "SELECT 1")
		return err
	}},
	{name: "CommitsItself", fatal: true, do: func(_ context.Context, tx *sql.Tx) error {
		_ = tx.Commit() // the bug: the error ignored
		return nil
	}},
	{name: "CommitStatement", fatal: true, do: func(ctx context.Context, tx *sql.Tx) error {
		_, _ = tx.ExecContext(ctx, "COMMIT") // the bug: the error ignored
		return nil
	}},
	{name: "CommitStatement/StrictGuard", fatal: true, opts: []idempotent.Option{idempotent.WithStrictGuard()}, do: func(ctx context.Context, tx *sql.Tx) error {
		_, _ = tx.ExecContext(ctx, "COMMIT")
		return nil
	}},
}

// mistakeScenarios returns a core scenario for each mistake: "Mistake/<name>".
func mistakeScenarios() []scenario {
	var out []scenario
	for _, m := range mistakes {
		sc := scenario{name: "Mistake/" + m.name, core: true, run: func(s *suite, t *testing.T) { s.runMistake(t, m) }}
		if m.fatal {
			// A batch is one transaction: a handler that ends it ends the
			// batch's, which its BatchHandler's doc describes.
			sc.needs = perMessage
		}
		out = append(out, sc)
	}
	return out
}

// runMistake publishes one message whose first handling makes m, between
// two neighbours: a fatal mistake dead-letters its message (matching
// idempotent.ErrAutocommit) with nothing of it committed, another is
// requeued and applied once; the neighbours are applied once either way,
// in whatever group or batch they shared with it.
func (s *suite) runMistake(t *testing.T, m mistake) {
	e := s.newEnv(t, m.opts...)
	e.ensureSchema()
	bad, n1, n2 := newOrder(50), newOrder(51), newOrder(52)
	var made atomic.Bool
	e.setHook(func(ctx context.Context, tx *sql.Tx, o order) error {
		if o.Key() != bad.Key() || made.Swap(true) {
			return nil
		}
		return m.do(ctx, tx)
	})
	at := time.Now().Add(-time.Minute)
	for _, o := range []order{n1, bad, n2} {
		e.publish(o, at, time.Time{}, nil)
	}
	e.start(e.config())
	if m.fatal && s.stoppedBy(e, bad) {
		return
	}
	if m.fatal {
		e.waitSettled(bad.Key(), adapter.DeadLetter, 1)
	} else {
		e.waitSettled(bad.Key(), adapter.Ack, 1)
	}
	e.waitSettled(n1.Key(), adapter.Ack, 1)
	e.waitSettled(n2.Key(), adapter.Ack, 1)
	e.stopAll()
	if !made.Load() {
		t.Fatalf("the handler of %s never made the mistake", bad.Key())
	}
	for _, o := range []order{n1, n2} {
		e.wantApplied(o.Key())
		if p := e.rec.of(o.Key(), adapter.DeadLetter, 0); len(p) != 0 {
			t.Errorf("neighbour %s dead-lettered: %v", o.Key(), p[0].Err)
		}
	}
	if m.fatal {
		dead := e.rec.of(bad.Key(), adapter.DeadLetter, 0)
		if len(dead) != 1 || !errors.Is(dead[0].Err, idempotent.ErrAutocommit) {
			t.Errorf("%s dead-lettered %+v, want once, matching idempotent.ErrAutocommit", bad.Key(), dead)
		}
		e.deadLettered(bad.Key())
		// Nothing of the mistaken attempt committed. A copy the broker
		// delivered again meanwhile (an ack deadline passed) may apply
		// the message, once; nothing is acked unapplied.
		a, _ := e.rec.count(bad.Key())
		switch acks := len(e.rec.of(bad.Key(), adapter.Ack, 0)); {
		case a > 1:
			t.Errorf("%s applied %d times", bad.Key(), a)
		case a == 0 && acks > 0:
			t.Errorf("%s acked %d times after its handler ended the transaction, never applied", bad.Key(), acks)
		case a == 1:
			e.audit(bad, n1, n2)
		default:
			e.audit(n1, n2)
		}
	} else {
		e.wantRequeuedThenAcked(bad.Key(), nil)
		e.wantApplied(bad.Key())
		e.audit(bad, n1, n2)
	}
	e.atBroker()
}

// stoppedBy waits until bad, whose handler ended the claim's transaction,
// is dead-lettered — it returns false — or, on an ordered transport
// (Features.Ordered), released with an error matching
// idempotent.ErrAutocommit: the adapter stopped the partition, loudly,
// rather than pass over a record whose effect it cannot vouch for (the
// kafka adapter in a coalesced group). It then checks that nothing was
// acked without its effect, nothing applied twice, and bad not at all, and
// returns true.
func (s *suite) stoppedBy(e *env, bad order) bool {
	e.t.Helper()
	stopped := func() bool {
		for _, st := range e.rec.of(bad.Key(), adapter.Requeue, 0) {
			if errors.Is(st.Err, idempotent.ErrAutocommit) {
				return true
			}
		}
		return false
	}
	e.waitFor("the dead letter (or the stop) of "+bad.Key(), func() bool {
		return stopped() || len(e.rec.of(bad.Key(), adapter.DeadLetter, 0)) > 0
	})
	if !stopped() {
		return false
	}
	if !s.f.Ordered {
		e.t.Errorf("%s released with %v on an unordered transport: want it dead-lettered", bad.Key(), e.rec.of(bad.Key(), adapter.Requeue, 0))
	}
	e.stopAll()
	e.t.Logf("the adapter stopped the partition: %v", e.rec.of(bad.Key(), adapter.Requeue, 0)[0].Err)
	var applied []order
	for _, o := range []order{newOrder(51), bad, newOrder(52)} {
		a, _ := e.rec.count(o.Key())
		if a > 1 || (a == 1 && o == bad) {
			e.t.Errorf("%s applied %d times", o.Key(), a)
		}
		if a == 1 {
			applied = append(applied, o)
		}
		if acks := len(e.rec.of(o.Key(), adapter.Ack, 0)); acks > 0 && a == 0 {
			e.t.Errorf("%s acked %d times, never applied", o.Key(), acks)
		}
	}
	e.audit(applied...)
	return true
}
