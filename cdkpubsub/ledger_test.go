package cdkpubsub_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"gocloud.dev/pubsub"
	"gocloud.dev/pubsub/mempubsub"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/cdkpubsub"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/postgres"
)

// The tests below run against the real test Postgres
// (IDEMPOTENT_POSTGRES_DSN, default the local server); without it they
// skip, except when CI is set, where they fail.

// ledger is the loyalty service on a schema of the test's own: claims,
// balances and a point ledger with one row per applied order.
type ledger struct {
	db     *sql.DB
	schema string
	mw     *idempotent.Middleware
}

type order = testenv.Order

// newLedger's opts are idempotent's options, after WithTable.
func newLedger(t testing.TB, opts ...idempotent.Option) *ledger {
	t.Helper()
	db := testenv.OpenPostgres(t, 24)
	schema := testenv.LoyaltySchema(t, db, "cdkpubsub")
	mw, err := idempotent.New(db, postgres.New(), "loyalty", append([]idempotent.Option{idempotent.WithTable(schema + ".processed_messages")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &ledger{db: db, schema: schema, mw: mw}
}

// outbox returns the outbox of consumer "loyalty" on a table of the
// ledger's schema, created.
func (l *ledger) outbox(t testing.TB) *outbox.Outbox {
	t.Helper()
	return testenv.Outbox(t, l.db, l.schema, "loyalty")
}

// relayDeadLetters runs an outbox Relay that publishes ob's rows of kind
// with DeadLetterSender to a dead-letter topic of its own, until n
// messages have come through it, and returns them, acked.
func relayDeadLetters(t testing.TB, ob *outbox.Outbox, kind string, n int) []*pubsub.Message {
	t.Helper()
	ctx := context.Background()
	dlq := mempubsub.NewTopic()
	dsub := mempubsub.NewSubscription(dlq, time.Minute)
	t.Cleanup(func() { _ = dsub.Shutdown(ctx); _ = dlq.Shutdown(ctx) })
	relay, err := outbox.NewRelay(ob, outbox.WithSender(kind, cdkpubsub.DeadLetterSender(dlq)), outbox.WithPollInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	}()
	var got []*pubsub.Message
	for range n {
		rc, cancel := context.WithTimeout(ctx, 10*time.Second)
		m, err := dsub.Receive(rc)
		cancel()
		if err != nil {
			t.Fatalf("dead-letter topic: %v", err)
		}
		m.Ack()
		got = append(got, m)
	}
	return got
}

// handler is the per-message effect: the order decoded from the body,
// credited through tx.
func (l *ledger) handler() cdkpubsub.Handler {
	return cdkpubsub.Decode(cdkpubsub.JSON[order], func(ctx context.Context, tx *sql.Tx, o order, _ *pubsub.Message) error {
		return testenv.Credit(ctx, tx, l.schema, o)
	})
}

// batchHandler credits a batch's fresh orders with one UPDATE of the
// balances, locked in ascending customer order so that concurrent batches
// cannot deadlock, and one INSERT of the ledger rows.
func (l *ledger) batchHandler() cdkpubsub.BatchHandler {
	return func(ctx context.Context, tx *sql.Tx, msgs []*pubsub.Message) error {
		orders := make([]order, len(msgs))
		for i, m := range msgs {
			o, err := cdkpubsub.JSON[order](m.Body)
			if err != nil {
				return adapter.PoisonItem(i, err)
			}
			orders[i] = o
		}
		return testenv.CreditBatch(ctx, tx, l.schema, orders)
	}
}

// sendOrder publishes o keyed by its Key, with its event time.
func sendOrder(t testing.TB, b *memBroker, o order, at time.Time) {
	t.Helper()
	body, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.send(context.Background(), o.Key(), map[string]string{adapter.EventTimeHeader: adapter.FormatEventTime(at)}, body); err != nil {
		t.Fatal(err)
	}
}

// process is one Run of a Consumer on a Subscription.
type process struct {
	sub    *pubsub.Subscription
	proc   *memProc
	cancel context.CancelFunc
	done   chan error
}

// start runs c on a new process's Subscription on b, with p's hooks.
func start(c *cdkpubsub.Consumer, b *memBroker, p *memProc) *process {
	sub, proc := b.process(p)
	ctx, cancel := context.WithCancel(context.Background())
	pr := &process{sub: sub, proc: proc, cancel: cancel, done: make(chan error, 1)}
	go func() { pr.done <- c.Run(ctx, sub) }()
	return pr
}

// stop ends the Run gracefully and shuts the Subscription down, which
// sends the acks still queued (nowhere, if the process was killed).
func (pr *process) stop(t testing.TB) {
	t.Helper()
	pr.cancel()
	select {
	case err := <-pr.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of its context's end")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := pr.sub.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// kill crashes the process: its acks go nowhere from now on, and its Run
// is told to stop without anyone waiting for it; wait collects it.
func (pr *process) kill() {
	pr.proc.kill()
	pr.cancel()
	go func() { _ = pr.sub.Shutdown(context.Background()) }()
}

// wait waits for a killed process's Run to return.
func (pr *process) wait(t testing.TB) {
	t.Helper()
	select {
	case <-pr.done:
	case <-time.After(30 * time.Second):
		t.Fatal("a killed process's Run did not return within 30s")
	}
}

// balance returns customer's points.
func (l *ledger) balance(t testing.TB, customer int64) int64 {
	t.Helper()
	return testenv.Count(t, l.db, l.schema, fmt.Sprintf("SELECT points FROM $S.balances WHERE customer_id = %d", customer))
}
