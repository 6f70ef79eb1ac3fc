package watermill_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/postgres"
	idwm "github.com/txclaim/idempotent/watermill"
)

// The tests run against a real Postgres (IDEMPOTENT_POSTGRES_DSN, default
// the local server) and, for watermill-amqp, the real RabbitMQ
// (IDEMPOTENT_AMQP_URL, default the local server). Without them the tests
// skip — except when CI is set, where they fail.

// ledger is the loyalty service on a schema of the test's own.
type ledger struct {
	db     *sql.DB
	schema string
	mw     *idempotent.Middleware
	counts *idempotent.Counts
}

// order is the loyalty service's message.
type order = testenv.Order

func newLedger(t testing.TB, db *sql.DB, consumer string, opts ...idempotent.Option) *ledger {
	t.Helper()
	schema := testenv.LoyaltySchema(t, db, "wm")
	counts := &idempotent.Counts{}
	opts = append([]idempotent.Option{idempotent.WithTable(schema + ".processed_messages"), idempotent.WithObserver(counts)}, opts...)
	mw, err := idempotent.New(db, postgres.New(), consumer, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &ledger{db: db, schema: schema, mw: mw, counts: counts}
}

// credit applies o through tx.
func (l *ledger) credit(ctx context.Context, tx *sql.Tx, o order) error {
	return testenv.Credit(ctx, tx, l.schema, o)
}

// handler is the Handler users write: it decodes the order and credits it
// through the claim's transaction. When failFirst says so, the first
// attempt of an order fails half-way through the effect — after the
// balance, before the ledger row — so a retry within the same transaction
// would credit the balance twice.
func (l *ledger) handler(failFirst func(order) bool) idwm.Handler {
	seen := newOnce()
	return idwm.Decode(idwm.JSON[order], func(ctx context.Context, tx *sql.Tx, o order, _ *message.Message) error {
		q := pq.QuoteIdentifier(l.schema)
		if _, err := tx.ExecContext(ctx, "UPDATE "+q+".balances SET points = points + $1 WHERE customer_id = $2", o.Points, o.CustomerID); err != nil {
			return err
		}
		if failFirst != nil && failFirst(o) && seen.first(o.OrderID) {
			return fmt.Errorf("order %d: pricing service timed out", o.OrderID)
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO "+q+".point_ledger (order_id, customer_id, points) VALUES ($1, $2, $3)", o.OrderID, o.CustomerID, o.Points)
		return err
	})
}

func (l *ledger) count(t testing.TB, query string) int64 {
	t.Helper()
	return testenv.Count(t, l.db, l.schema, query)
}

// audit checks the effects are exactly those of the unique orders: one
// ledger row and one claim each, every balance exact.
func (l *ledger) audit(t testing.TB, orders []order) {
	t.Helper()
	testenv.AuditOrders(t, l.db, l.schema, orders)
}

// orderMessage is o as a producer publishes it: its key as the UUID, the
// same on every publish.
func orderMessage(t testing.TB, o order) *message.Message {
	t.Helper()
	b, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	return message.NewMessage(o.Key(), b)
}

// keyedMessage is o as a producer publishes it that mints a fresh UUID
// per publish and keeps the key in the KeyMetadata field, for a handler
// keyed by Header(KeyMetadata).
func keyedMessage(t testing.TB, o order) *message.Message {
	t.Helper()
	m := orderMessage(t, o)
	m.UUID = watermill.NewUUID()
	m.Metadata.Set(idwm.KeyMetadata, o.Key())
	return m
}

// withDuplicates returns the messages of orders, every fourth one published
// a second time a little later.
func withDuplicates(t testing.TB, orders []order) []*message.Message {
	t.Helper()
	var msgs []*message.Message
	for i, o := range orders {
		msgs = append(msgs, orderMessage(t, o))
		if i%4 == 0 && i >= 20 {
			msgs = append(msgs, orderMessage(t, orders[i-20]))
		}
	}
	return msgs
}

// waitFor polls cond until it holds, failing the test after within.
func waitFor(t testing.TB, within time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	waitWhileProgressing(t, within, what, func() int64 { return 0 }, nil, cond)
}

// waitWhileProgressing is waitFor for a bulk of messages: it waits as long
// as progress (a count of messages settled) keeps rising, and fails only
// when it has not risen for stall — a loaded machine makes the bulk slower,
// not stuck. excuse, when not nil, names a cause outside the code under
// test that holds the bulk back (a transaction of another session); while
// it names one, the wait goes on.
func waitWhileProgressing(t testing.TB, stall time.Duration, what string, progress func() int64, excuse func() string, cond func() (bool, error)) {
	t.Helper()
	last, since, told := progress(), time.Now(), ""
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if p := progress(); p != last {
			last, since = p, time.Now()
		}
		if time.Since(since) > stall {
			why := ""
			if excuse != nil {
				why = excuse()
			}
			if why == "" {
				t.Fatalf("waiting for %s: no progress for %v (at %d)", what, stall, last)
			}
			if why != told {
				t.Logf("waiting for %s, held back by %s", what, why)
				told = why
			}
			since = time.Now()
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// runRouter runs r until the test ends.
func runRouter(t testing.TB, r *message.Router) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case <-r.Running():
	case err := <-done:
		t.Fatalf("router: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("router: %v", err)
		}
	})
}

func newRouter(t testing.TB) *message.Router {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// ours is NewHandler(l.mw, h, opts...).
func ours(t testing.TB, l *ledger, h idwm.Handler, opts ...idwm.Option) message.NoPublishHandlerFunc {
	t.Helper()
	f, err := idwm.NewHandler(l.mw, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
