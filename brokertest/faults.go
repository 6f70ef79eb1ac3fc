package brokertest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

// errHolder ends the transaction that held a claim in the claim-busy
// scenario: it rolls back, leaving the claim to the consumer.
var errHolder = errors.New("brokertest: the transaction holding the claim gives it up")

// faultScenarios are the database's faults around a successful handler:
// a COMMIT that fails, a claim another transaction holds, retries that run
// out, and a partitioned claim without an event time. Each must leave the
// message requeued (or poison, for the last), never acked before its
// effect committed, and applied exactly once.
var faultScenarios = []scenario{
	{name: "CommitFails", core: true, run: func(s *suite, t *testing.T) {
		// The handler succeeds and the COMMIT fails (a deferred constraint
		// checked at COMMIT): the delivery is requeued, not acked; once
		// the fault is removed it is applied once. Its neighbour is
		// applied once too.
		e := s.newEnv(t)
		e.ensureSchema()
		o, n := newOrder(40), newOrder(41)
		e.failCommitOf(o)
		at := time.Now().Add(-time.Minute)
		e.publish(o, at, time.Time{}, nil)
		e.publish(n, at, time.Time{}, nil)
		e.start(e.config())
		e.waitSettled(o.Key(), adapter.Requeue, 1)
		e.removeCommitFaults()
		e.waitSettled(o.Key(), adapter.Ack, 1)
		e.waitSettled(n.Key(), adapter.Ack, 1)
		e.stopAll()
		e.wantRequeuedThenAcked(o.Key(), nil)
		e.wantApplied(o.Key())
		e.wantApplied(n.Key())
		e.audit(o, n)
		e.atBroker()
	}},
	{name: "ClaimBusy", core: true, needs: perMessage, run: func(s *suite, t *testing.T) {
		// Another transaction holds the message's claim past the lock
		// timeout: ErrClaimBusy, requeued — never terminated nor acked —
		// and applied once after the holder rolled back.
		e := s.newEnv(t, idempotent.WithLockTimeout(100*time.Millisecond))
		e.ensureSchema()
		o := newOrder(42)
		at := time.Now().Add(-time.Minute)
		held, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
		go func() {
			_, err := e.mw.ProcessMessage(context.Background(), idempotent.Message{Key: o.Key(), EventTime: at}, func(context.Context, *sql.Tx) error {
				close(held)
				<-release
				return errHolder
			})
			done <- err
		}()
		<-held
		// Released however the scenario ends: the schema's cleanup waits
		// for the holder's transaction.
		letGo := sync.OnceFunc(func() { close(release) })
		defer letGo()
		e.publish(o, at, time.Time{}, nil)
		e.start(e.config())
		e.waitFor("a requeue with ErrClaimBusy", func() bool {
			if len(e.rec.of(o.Key(), adapter.DeadLetter, 0)) > 0 {
				return true // wrong, and said below
			}
			for _, st := range e.rec.of(o.Key(), adapter.Requeue, 0) {
				if errors.Is(st.Err, idempotent.ErrClaimBusy) {
					return true
				}
			}
			return false
		})
		if p := e.rec.of(o.Key(), adapter.DeadLetter, 0); len(p) > 0 {
			t.Fatalf("%s dead-lettered while another transaction held its claim: %v; want requeued", o.Key(), p[0].Err)
		}
		letGo()
		if err := <-done; !errors.Is(err, errHolder) {
			t.Fatalf("the holder: %v, want its own error", err)
		}
		e.waitSettled(o.Key(), adapter.Ack, 1)
		e.stopAll()
		e.wantRequeuedThenAcked(o.Key(), idempotent.ErrClaimBusy)
		e.wantApplied(o.Key())
		e.audit(o)
		e.atBroker()
	}},
	{name: "RetriesExhausted", core: true, run: func(s *suite, t *testing.T) {
		// The claim's transaction meets a serialization failure on every
		// attempt the retry policy allows: ErrRetriesExhausted, requeued —
		// never terminated nor acked — then applied once.
		e := s.newEnv(t, idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))
		e.ensureSchema()
		o := newOrder(43)
		var attempts atomic.Int32
		e.setHook(func(ctx context.Context, tx *sql.Tx, got order) error {
			if got.Key() != o.Key() || attempts.Add(1) > 2 {
				return nil
			}
			_, err := tx.ExecContext(ctx, `DO $$ BEGIN RAISE EXCEPTION 'brokertest: a serialization failure' USING ERRCODE = '40001'; END $$`)
			return err
		})
		e.publish(o, time.Now().Add(-time.Minute), time.Time{}, nil)
		e.start(e.config())
		e.waitSettled(o.Key(), adapter.Ack, 1)
		e.stopAll()
		e.wantRequeuedThenAcked(o.Key(), idempotent.ErrRetriesExhausted)
		e.wantApplied(o.Key())
		e.audit(o)
		e.atBroker()
	}},
	{name: "Partitioned/NoEventTimeHeader", run: func(s *suite, t *testing.T) {
		// On a day-partitioned table a message without the event-time
		// header is poison exactly once (adapter.ErrNoEventTime), nothing
		// written: never claimed on a day taken from the transport. The
		// message beside it is applied once.
		e := s.newEnv(t, idempotent.WithDailyPartitions(1), idempotent.WithRetention(48*time.Hour))
		now := time.Date(2031, 3, 15, 12, 0, 0, 0, time.UTC)
		e.clock.Set(now)
		e.ensureSchema()
		bare, good := newOrder(44), newOrder(45)
		e.publish(bare, time.Time{}, now, nil)
		e.publish(good, now.Add(-time.Hour), now, nil)
		e.poisonBeside(bare, good, adapter.ErrNoEventTime)
	}},
	{name: "PositionInClaimTransaction", run: func(s *suite, t *testing.T) {
		// Where the adapter stores its position in the claim's database
		// (PositionStore), the position moves in the claim's own
		// transaction: the same transaction id as the effect's.
		e := s.newEnv(t)
		ps, ok := e.tr.(PositionStore)
		if !ok {
			t.Skip("the transport stores no position in the claim's database (PositionStore)")
		}
		e.ensureSchema()
		o := newOrder(46)
		e.publish(o, time.Now().Add(-time.Minute), time.Time{}, nil)
		e.start(e.config())
		e.waitSettled(o.Key(), adapter.Ack, 1)
		e.stopAll()
		e.wantApplied(o.Key())
		e.audit(o)
		var effect string
		q := fmt.Sprintf(`SELECT xmin::text FROM %q.point_ledger WHERE order_id = $1`, e.schema)
		if err := s.db.QueryRowContext(context.Background(), q, o.OrderID).Scan(&effect); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitWithin)
		defer cancel()
		pos, err := ps.PositionTxid(ctx)
		if err != nil {
			t.Fatalf("PositionTxid: %v", err)
		}
		if pos != effect {
			t.Errorf("the position was stored by transaction %s, the effect by %s: want one transaction", pos, effect)
		}
	}},
}

// failCommitOf makes every COMMIT fail that writes o's ledger row, until
// removeCommitFaults: a constraint trigger deferred to COMMIT raises when
// the order is in the scenario's commit_faults table.
func (e *env) failCommitOf(o order) {
	e.t.Helper()
	q := `"` + e.schema + `"`
	for _, stmt := range []string{
		"CREATE TABLE " + q + ".commit_faults (order_id bigint PRIMARY KEY)",
		"INSERT INTO " + q + ".commit_faults VALUES (" + fmt.Sprint(o.OrderID) + ")",
		"CREATE FUNCTION " + q + `.fail_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF EXISTS (SELECT 1 FROM ` + q + `.commit_faults WHERE order_id = NEW.order_id) THEN
		RAISE EXCEPTION 'brokertest: the deferred constraint fails at COMMIT';
	END IF;
	RETURN NULL;
END $$`,
		"CREATE CONSTRAINT TRIGGER fail_commit AFTER INSERT ON " + q + ".point_ledger DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION " + q + ".fail_commit()",
	} {
		if _, err := e.s.db.ExecContext(context.Background(), stmt); err != nil {
			e.t.Fatalf("%s: %v", stmt, err)
		}
	}
}

// removeCommitFaults lets every COMMIT through again.
func (e *env) removeCommitFaults() {
	e.t.Helper()
	if _, err := e.s.db.ExecContext(context.Background(), `DELETE FROM "`+e.schema+`".commit_faults`); err != nil {
		e.t.Fatal(err)
	}
}

// wantRequeuedThenAcked checks key was requeued at least once (the first
// requeue's error matching first, when not nil), never dead-lettered, and
// acked (more than once only where the broker delivered it again).
func (e *env) wantRequeuedThenAcked(key string, first error) {
	e.t.Helper()
	var requeues, acks int
	for _, st := range e.rec.of(key, 0, 0) {
		switch st.Action {
		case adapter.Requeue:
			if requeues == 0 && first != nil && !errors.Is(st.Err, first) {
				e.t.Errorf("%s: first requeued with %v, want an error matching %v", key, st.Err, first)
			}
			requeues++
		case adapter.Ack:
			acks++
		default:
			e.t.Errorf("%s settled %v (%v), want requeued until applied, never dead-lettered", key, st.Action, st.Err)
		}
	}
	if requeues == 0 || acks == 0 {
		e.t.Errorf("%s: %d requeues and %d acks, want at least one requeue, then an ack", key, requeues, acks)
	}
}

// atBroker checks, where the transport is an Inspector, that the broker
// holds none of the scenario's messages unsettled once every consumer
// stopped: every ack the adapter reported reached the broker.
func (e *env) atBroker() {
	e.t.Helper()
	in, ok := e.tr.(Inspector)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitWithin)
	defer cancel()
	n, err := in.Unsettled(ctx)
	if err != nil {
		e.t.Fatalf("Unsettled: %v", err)
	}
	if n != 0 {
		e.t.Errorf("the broker holds %d messages unsettled after every consumer stopped, want 0: an ack the adapter reported did not reach it", n)
	}
}

// deadLettered checks, where the adapter dead-letters poison and the
// transport is an Inspector, that key is in the dead-letter destination
// exactly once.
func (e *env) deadLettered(key string) {
	e.t.Helper()
	in, ok := e.tr.(Inspector)
	if !ok || !e.s.f.DeadLetter {
		return
	}
	var keys []string
	count := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), waitWithin)
		defer cancel()
		var err error
		if keys, err = in.DeadLetters(ctx); err != nil {
			e.t.Fatalf("DeadLetters: %v", err)
		}
		n := 0
		for _, k := range keys {
			if k == key {
				n++
			}
		}
		return n
	}
	// A dead letter may reach its destination after the settlement was
	// reported (a broker routes it on its own): a bounded poll.
	e.waitFor(key+" in the dead-letter destination", func() bool { return count() >= 1 })
	if n := count(); n != 1 {
		e.t.Errorf("%s is %d times in the dead-letter destination (%q), want once", key, n, keys)
	}
}

// poisonBeside starts a consumer and checks bad is poison exactly once
// (matching want, in the dead-letter destination where there is one) and
// good, published beside it, is applied once; the broker holds nothing.
func (e *env) poisonBeside(bad, good order, want error) {
	e.t.Helper()
	e.start(e.config())
	e.waitSettled(bad.Key(), adapter.DeadLetter, 1)
	e.waitSettled(good.Key(), adapter.Ack, 1)
	e.stopAll()
	wantOnlyPoison(e.t, e, bad.Key(), want)
	e.wantApplied(good.Key())
	e.audit(good)
	e.atBroker()
}

// wantApplied checks key was Applied exactly once; Duplicates are a
// broker's redeliveries (an ack deadline that passed on a loaded machine).
func (e *env) wantApplied(key string) {
	e.t.Helper()
	if a, _ := e.rec.count(key); a != 1 {
		e.t.Errorf("%s applied %d times, want 1", key, a)
	}
}
