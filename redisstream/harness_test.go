package redisstream_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/redisstream"
)

// The tests run against a real Postgres (IDEMPOTENT_POSTGRES_DSN, default
// the local server) and a real Redis (IDEMPOTENT_REDIS_ADDR, default
// 127.0.0.1:6379); a test that must stop Redis starts a redis-server of its
// own. Without them the tests skip — except when CI is set, where they
// fail.

// redisAddr is the shared Redis the tests use.
func redisAddr() string { return testenv.Getenv("IDEMPOTENT_REDIS_ADDR", "127.0.0.1:6379") }

// newClient returns a client of addr, closed in Cleanup (a second Close is
// harmless), skipping the test when Redis does not answer.
func newClient(t testing.TB, addr string, hooks ...redis.Hook) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	for _, h := range hooks {
		rdb.AddHook(h)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		testenv.Unavailable(t, "redis at %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// newStream returns a stream name of the test's own with group made on it,
// deleted in Cleanup.
func newStream(t testing.TB, rdb *redis.Client, group string) string {
	t.Helper()
	stream := testenv.UniqueName("redisstream-test")
	if err := rdb.XGroupCreateMkStream(context.Background(), stream, group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Del(context.Background(), stream).Err() })
	return stream
}

// ledger is the loyalty service on a schema of the test's own: claims,
// balances and a point ledger with one row per applied order.
type ledger struct {
	db     *sql.DB
	schema string
	mw     *idempotent.Middleware
}

type order = testenv.Order

func newLedger(t testing.TB, db *sql.DB, consumer string, opts ...idempotent.Option) *ledger {
	t.Helper()
	schema := testenv.LoyaltySchema(t, db, "redisstream")
	mw, err := idempotent.New(db, postgres.New(), consumer, append([]idempotent.Option{idempotent.WithTable(schema + ".processed_messages")}, opts...)...)
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

// deadStream names a dead-letter stream for stream, deleted in Cleanup.
func deadStream(t testing.TB, rdb *redis.Client, stream string) string {
	dead := stream + "-dead"
	t.Cleanup(func() { _ = rdb.Del(context.Background(), dead).Err() })
	return dead
}

// relayDeadLetters runs an outbox Relay with DeadLetterSender on ob until
// the dead-letter stream dead holds n entries, and returns them.
func relayDeadLetters(t testing.TB, ob *outbox.Outbox, rdb *redis.Client, dead string, n int64) []redis.XMessage {
	t.Helper()
	relay, err := outbox.NewRelay(ob, outbox.WithSender(redisstream.DeadLetterKind, redisstream.DeadLetterSender(rdb)),
		outbox.WithPollInterval(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	waitFor(t, 10*time.Second, "the dead letters sent", func() bool {
		m, err := rdb.XLen(ctx, dead).Result()
		return err == nil && m == n
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got, err := rdb.XRange(context.Background(), dead, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// handler is the per-message effect: the order decoded from the payload,
// credited through tx.
func (l *ledger) handler() redisstream.Handler {
	return redisstream.Decode(redisstream.JSON[order], func(ctx context.Context, tx *sql.Tx, o order, _ *redisstream.Delivery) error {
		return testenv.Credit(ctx, tx, l.schema, o)
	})
}

// batchHandler credits the orders of a batch's fresh entries with two
// statements, the balances locked in ascending customer order so that
// concurrent batches cannot deadlock.
func (l *ledger) batchHandler() redisstream.BatchHandler {
	return func(ctx context.Context, tx *sql.Tx, ds []*redisstream.Delivery) error {
		orders := make([]order, len(ds))
		for i, d := range ds {
			o, err := redisstream.JSON[order](d.Payload())
			if err != nil {
				return adapter.PoisonItem(i, err)
			}
			orders[i] = o
		}
		return testenv.CreditBatch(ctx, tx, l.schema, orders)
	}
}

// publish adds o to stream as a producer does: the key, the event time
// at (none when zero) and the JSON payload. It returns the entry id.
func publish(t testing.TB, rdb *redis.Client, stream string, o order, at time.Time) string {
	t.Helper()
	vals := []any{redisstream.DefaultKeyField, o.Key(), redisstream.PayloadField, mustJSON(t, o)}
	if !at.IsZero() {
		vals = append(vals, adapter.EventTimeHeader, adapter.FormatEventTime(at))
	}
	id, err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: vals}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// events records a Consumer's events, in order: an adapter.Observer.
type events struct {
	mu  sync.Mutex
	all []adapter.Event
}

func (e *events) Observe(_ context.Context, ev adapter.Event) {
	e.mu.Lock()
	e.all = append(e.all, ev)
	e.mu.Unlock()
}

// of returns the events of type typ.
func (e *events) of(typ adapter.EventType) []adapter.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []adapter.Event
	for _, ev := range e.all {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

// waitFor polls cond every few milliseconds until it holds, failing the
// test after within.
func waitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// running is a Run in the background.
type running struct {
	cancel context.CancelFunc
	done   chan error
}

// start runs c on stream in the background; stop ends it.
func start(c *redisstream.Consumer, rdb redis.UniversalClient, stream, group string) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx, rdb, stream, group) }()
	return r
}

// stop shuts the Run down gracefully and returns its error.
func (r *running) stop(t testing.TB) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return within 20s of its context's end")
		return nil
	}
}

// wait waits for the Run to end on its own and returns its error.
func (r *running) wait(t testing.TB) error {
	t.Helper()
	select {
	case err := <-r.done:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return within 20s")
		return nil
	}
}

// loseAcks is a client hook that drops the XACKs of the entries lose says
// to, as a process that dies between commit and XACK does.
type loseAcks struct {
	lose func(id string) bool
}

func (loseAcks) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h loseAcks) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.dropped(cmd) {
			return nil
		}
		return next(ctx, cmd)
	}
}

func (h loseAcks) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		kept := cmds[:0:0]
		for _, c := range cmds {
			if !h.dropped(c) {
				kept = append(kept, c)
			}
		}
		if len(kept) == 0 {
			return nil
		}
		return next(ctx, kept)
	}
}

// dropped reports whether cmd is an XACK of one entry to lose.
func (h loseAcks) dropped(cmd redis.Cmder) bool {
	a := cmd.Args()
	if len(a) != 4 || cmd.Name() != "xack" {
		return false
	}
	id, ok := a[3].(string)
	return ok && h.lose(id)
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
