package tests

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/kafka"
	idnats "github.com/txclaim/idempotent/nats"
	"github.com/txclaim/idempotent/oteltrace"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/rabbitmq"
	"github.com/txclaim/idempotent/redisstream"
)

// One trace from producer to effect: a request's span enqueues an outbox
// row; a relay sends it (a send span, the request's child) through a
// broker; the adapter's consumer span (the send span's child) claims it,
// and the handler's effect span is the consumer span's child. Each broker
// delivers the message twice, as after a lost acknowledgement: the second
// delivery's span says duplicate.

const traceKind = "order-placed"

// traceRig is what every broker's trace test shares: the tracer, an
// outbox and a Middleware on tables of a schema of the test's own, and the
// effects table.
type traceRig struct {
	tr     *oteltrace.Tracer
	exp    *tracetest.InMemoryExporter
	test   trace.Tracer
	db     *sql.DB
	ob     *outbox.Outbox
	mw     *idempotent.Middleware
	schema string
	events chan adapter.Event
}

func newTraceRig(t *testing.T, mwOpts ...idempotent.Option) *traceRig {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return newTraceRigOn(t, exp, tp, mwOpts...)
}

// newTraceRigOn is newTraceRig recording with tp to exp.
func newTraceRigOn(t *testing.T, exp *tracetest.InMemoryExporter, tp trace.TracerProvider, mwOpts ...idempotent.Option) *traceRig {
	t.Helper()
	tr, err := oteltrace.New(tp)
	if err != nil {
		t.Fatal(err)
	}
	db := openDB(t)
	ob, schema := newOutbox(t, db, "orders", outbox.WithTracer(tr), outbox.WithoutNotify())
	if _, err := db.Exec(`CREATE TABLE "` + schema + `".effects (key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	mw, err := idempotent.New(db, postgres.New(), "shipping", append([]idempotent.Option{idempotent.WithTable(schema + ".processed_messages")}, mwOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &traceRig{tr: tr, exp: exp, test: tp.Tracer("test"), db: db, ob: ob, mw: mw, schema: schema, events: make(chan adapter.Event, 1000)}
}

// observer passes the adapter's events to the test.
func (r *traceRig) observer() adapter.Observer {
	return adapter.ObserverFunc(func(_ context.Context, e adapter.Event) { r.events <- e })
}

// effect is the handler's effect, in a span of its own.
func (r *traceRig) effect(ctx context.Context, tx *sql.Tx, key string) error {
	ctx, span := r.test.Start(ctx, "effect")
	defer span.End()
	_, err := tx.ExecContext(ctx, `INSERT INTO "`+r.schema+`".effects (key) VALUES ($1)`, key)
	return err
}

// produce enqueues n rows, each in a request span of its own, and returns
// the requests' span contexts by the rows' idempotency keys.
func (r *traceRig) produce(t *testing.T, n int) map[string]trace.SpanContext {
	t.Helper()
	out := map[string]trace.SpanContext{}
	for i := range n {
		ctx, req := r.test.Start(context.Background(), "request")
		tx, err := r.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		key, err := r.ob.Enqueue(ctx, tx, "order-"+strconv.Itoa(i), traceKind, []byte(fmt.Sprintf(`{"order":%d}`, i)))
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		req.End()
		out[key] = req.SpanContext()
	}
	return out
}

// relay runs a relay with s until the end of the test.
func (r *traceRig) relay(t *testing.T, s outbox.Sender) {
	t.Helper()
	rl, err := outbox.NewRelay(r.ob, outbox.WithSender(traceKind, s), outbox.WithPollInterval(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, "relay", rl.Run)
}

// runUntilCleanup runs f until the end of the test.
func runUntilCleanup(t *testing.T, what string, f func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: %v", what, err)
		}
	})
}

// settled waits for n deliveries to be settled as applied or duplicate
// (their spans have ended by then) and returns how many of each.
func (r *traceRig) settled(t *testing.T, n int) (applied, dups int) {
	t.Helper()
	timeout := time.After(time.Minute)
	for applied+dups < n {
		select {
		case e := <-r.events:
			switch e.Type {
			case adapter.EventApplied:
				applied++
			case adapter.EventDuplicate:
				dups++
			case adapter.EventDeadLettered, adapter.EventRequeued:
				t.Fatalf("delivery %s: %v: %v", e.Source, e.Type, e.Err)
			}
		case <-timeout:
			t.Fatalf("%d deliveries settled within a minute, want %d", applied+dups, n)
		}
	}
	return applied, dups
}

// twice is a Sender that sends each call twice, as a relay does when the
// first acknowledgement is lost.
func twice(s outbox.SenderFunc) outbox.Sender {
	return outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		if err := s(ctx, m); err != nil {
			return err
		}
		return s(ctx, m)
	})
}

// spansWhere returns the ended spans for which keep holds.
func (r *traceRig) spansWhere(keep func(tracetest.SpanStub) bool) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range r.exp.GetSpans() {
		if keep(s) {
			out = append(out, s)
		}
	}
	return out
}

// wantChain checks the trace of the one row produced (request req): one
// send span, the request's child; two consumer spans of system, the send
// span's children, the first applied and the second a duplicate, each with
// dest (none: "") and key; one effect span, the applied span's child; all in req's
// trace.
func (r *traceRig) wantChain(t *testing.T, req trace.SpanContext, key, system, dest string) {
	t.Helper()
	sends := r.spansWhere(func(s tracetest.SpanStub) bool { return s.Name == traceKind+" send" })
	if len(sends) != 1 {
		t.Fatalf("%d send spans, want 1", len(sends))
	}
	send := sends[0]
	if send.SpanKind != trace.SpanKindProducer || send.Parent.SpanID() != req.SpanID() || send.SpanContext.TraceID() != req.TraceID() {
		t.Errorf("send span: kind %v, parent %v in trace %v; want a producer span, child of the request %v", send.SpanKind, send.Parent.SpanID(), send.SpanContext.TraceID(), req.SpanID())
	}
	procs := r.spansWhere(func(s tracetest.SpanStub) bool { return s.SpanKind == trace.SpanKindConsumer })
	if len(procs) != 2 {
		t.Fatalf("%d consumer spans, want 2 (applied, duplicate): %v", len(procs), procs)
	}
	name := "process" // an adapter that does not know the destination
	if dest != "" {
		name += " " + dest
	}
	for i, want := range []string{"applied", "duplicate"} {
		p := procs[i]
		a := spanAttrs(p.Attributes)
		if p.Name != name || a["messaging.system"] != system || a["messaging.operation.type"] != "process" ||
			a["messaging.destination.name"] != dest || a["idempotent.key"] != key || a["idempotent.outcome"] != want {
			t.Errorf("consumer span %d: %q %v; want process %s of system %s, key %s, outcome %s", i, p.Name, a, dest, system, key, want)
		}
		if p.Parent.SpanID() != send.SpanContext.SpanID() || p.SpanContext.TraceID() != req.TraceID() {
			t.Errorf("consumer span %d: parent %v in trace %v; want the send span %v in trace %v", i, p.Parent.SpanID(), p.SpanContext.TraceID(), send.SpanContext.SpanID(), req.TraceID())
		}
	}
	effects := r.spansWhere(func(s tracetest.SpanStub) bool { return s.Name == "effect" })
	if len(effects) != 1 || effects[0].Parent.SpanID() != procs[0].SpanContext.SpanID() {
		t.Errorf("%d effect spans (%v), want one, child of the applied consumer span %v", len(effects), effects, procs[0].SpanContext.SpanID())
	}
}

// only returns the one key and span context of m.
func only(t *testing.T, m map[string]trace.SpanContext) (string, trace.SpanContext) {
	t.Helper()
	if len(m) != 1 {
		t.Fatalf("%d rows, want 1", len(m))
	}
	for k, sc := range m {
		return k, sc
	}
	panic("unreachable")
}

// amqpSender publishes each call to queue, with the call's trace context
// and idempotency key as the message's headers and message-id.
func amqpSender(t *testing.T, url, queue string) outbox.SenderFunc {
	ch := openChannel(t, dialTest(t, url))
	return func(ctx context.Context, m outbox.Message) error {
		h := amqp.Table{}
		for k, v := range m.Trace {
			h[k] = v
		}
		return ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{MessageId: m.IdempotencyKey, Headers: h, Body: m.Payload})
	}
}

func TestTraceThroughRabbitMQ(t *testing.T) {
	t.Parallel()
	r := newTraceRig(t)
	key, req, queue := r.throughRabbitMQ(t)
	r.wantChain(t, req, key, "rabbitmq", queue)
}

// throughRabbitMQ produces one row, relays it twice to a queue of the
// test's own and has a RabbitMQ consumer with r's tracer apply it; it
// returns the row's key, its request's span context and the queue once
// both deliveries are settled (one applied, one duplicate).
func (r *traceRig) throughRabbitMQ(t *testing.T) (key string, req trace.SpanContext, queue string) {
	t.Helper()
	url := amqpURL(t)
	top := declareTopology(t, url)
	c, err := rabbitmq.NewConsumer(r.mw, func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		return r.effect(ctx, tx, d.MessageId)
	}, rabbitmq.WithTracer(r.tr), rabbitmq.WithObserver(r.observer()))
	if err != nil {
		t.Fatal(err)
	}
	ch := openChannel(t, dialTest(t, url))
	runUntilCleanup(t, "consumer", func(ctx context.Context) error { return c.Run(ctx, ch, top.queue) })
	key, req = only(t, r.produce(t, 1))
	r.relay(t, twice(amqpSender(t, url, top.queue)))
	if a, d := r.settled(t, 2); a != 1 || d != 1 {
		t.Fatalf("%d applied, %d duplicates; want 1 and 1", a, d)
	}
	return key, req, top.queue
}

// TestTraceOfARabbitMQBatch sends 50 rows, each enqueued in a request of
// its own, to a batch consumer: each batch's transaction is one consumer
// span with one link to each of its messages' send spans. (How the
// broker's pushes fall into batches is the broker's timing.)
func TestTraceOfARabbitMQBatch(t *testing.T) {
	t.Parallel()
	url := amqpURL(t)
	r := newTraceRig(t)
	top := declareTopology(t, url)
	const n = 50
	reqs := r.produce(t, n)
	// Every message is in the queue before the consumer starts, so the
	// first batch holds them all.
	send := amqpSender(t, url, top.queue)
	r.relay(t, send)
	waitFor(t, "the rows sent", func() (bool, error) {
		s, err := r.ob.Stats(context.Background())
		return s.Pending == 0, err
	})
	c, err := rabbitmq.NewBatchConsumer(r.mw, func(ctx context.Context, tx *sql.Tx, ds []*amqp.Delivery) error {
		for _, d := range ds {
			if err := r.effect(ctx, tx, d.MessageId); err != nil {
				return err
			}
		}
		return nil
	}, rabbitmq.WithTracer(r.tr), rabbitmq.WithObserver(r.observer()), rabbitmq.WithBatchSize(n), rabbitmq.WithPrefetch(n))
	if err != nil {
		t.Fatal(err)
	}
	ch := openChannel(t, dialTest(t, url))
	runUntilCleanup(t, "consumer", func(ctx context.Context) error { return c.Run(ctx, ch, top.queue) })
	if a, _ := r.settled(t, n); a != n {
		t.Fatalf("%d applied, want %d", a, n)
	}
	r.wantBatches(t, reqs, n, 0)
}

// wantBatches checks the trace of the n rows produced (their requests
// reqs) consumed in batches: each row's send span is its request's child;
// each consumer span of several deliveries links to each one's send span,
// one link per delivery, and one of a single delivery is its send span's
// child; every row is in exactly one consumer span; each effect span is
// its consumer span's child. With spans > 0, there must be that many
// consumer spans.
func (r *traceRig) wantBatches(t *testing.T, reqs map[string]trace.SpanContext, n, spans int) {
	t.Helper()
	sendOf := map[trace.SpanID]string{} // send span -> its row's idempotency key
	for _, s := range r.spansWhere(func(s tracetest.SpanStub) bool { return s.Name == traceKind+" send" }) {
		key := spanAttrs(s.Attributes)["messaging.message.id"]
		if req, ok := reqs[key]; !ok || s.Parent.SpanID() != req.SpanID() || s.SpanContext.TraceID() != req.TraceID() {
			t.Errorf("send span of %s: parent %v, want its request", key, s.Parent.SpanID())
		}
		sendOf[s.SpanContext.SpanID()] = key
	}
	if len(sendOf) != n {
		t.Fatalf("%d send spans, want %d", len(sendOf), n)
	}
	procs := r.spansWhere(func(s tracetest.SpanStub) bool { return s.SpanKind == trace.SpanKindConsumer })
	if spans > 0 && len(procs) != spans {
		t.Fatalf("%d consumer spans, want %d", len(procs), spans)
	}
	seen := map[trace.SpanID]bool{}
	procIDs := map[trace.SpanID]bool{}
	for _, p := range procs {
		procIDs[p.SpanContext.SpanID()] = true
		a := spanAttrs(p.Attributes)
		if len(p.Links) == 0 {
			if _, ok := sendOf[p.Parent.SpanID()]; !ok || seen[p.Parent.SpanID()] || a["idempotent.outcome"] != "applied" {
				t.Errorf("consumer span %q of one delivery: parent %v, outcome %s; want a send span not seen before, applied", p.Name, p.Parent.SpanID(), a["idempotent.outcome"])
			}
			seen[p.Parent.SpanID()] = true
			continue
		}
		if a["messaging.batch.message_count"] != strconv.Itoa(len(p.Links)) || a["idempotent.batch.applied"] != strconv.Itoa(len(p.Links)) {
			t.Errorf("batch span with %d links: attributes %v", len(p.Links), a)
		}
		for _, l := range p.Links {
			key, ok := sendOf[l.SpanContext.SpanID()]
			if !ok || seen[l.SpanContext.SpanID()] || spanAttrs(l.Attributes)["idempotent.key"] != key {
				t.Errorf("link to %v (%v): to no send span of its message, or to one linked before", l.SpanContext.SpanID(), spanAttrs(l.Attributes))
			}
			seen[l.SpanContext.SpanID()] = true
		}
	}
	if len(seen) != n {
		t.Errorf("%d rows in consumer spans, want %d", len(seen), n)
	}
	effects := r.spansWhere(func(s tracetest.SpanStub) bool { return s.Name == "effect" })
	for _, e := range effects {
		if !procIDs[e.Parent.SpanID()] {
			t.Errorf("effect span under %v, no consumer span", e.Parent.SpanID())
		}
	}
	if len(effects) != n {
		t.Errorf("%d effect spans, want %d", len(effects), n)
	}
}

// TestTraceOfARedisStreamsBatch relays 50 rows with the redisstream
// package's own Sender, which puts the trace context in the entries'
// fields, then reads them with a batch consumer: one read of 50 entries,
// one transaction, one consumer span with 50 links.
func TestTraceOfARedisStreamsBatch(t *testing.T) {
	t.Parallel()
	addr := os.Getenv("IDEMPOTENT_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skipf("no Redis at %s: %v", addr, err)
	}
	stream := uniqueName("trace")
	t.Cleanup(func() { _ = rdb.Del(context.Background(), stream).Err() })
	r := newTraceRig(t)
	const n = 50
	reqs := r.produce(t, n)
	sender, err := redisstream.NewSender(rdb, func(outbox.Message) string { return stream })
	if err != nil {
		t.Fatal(err)
	}
	r.relay(t, sender)
	waitFor(t, "the rows sent", func() (bool, error) {
		s, err := r.ob.Stats(context.Background())
		return s.Pending == 0, err
	})
	c, err := redisstream.NewBatchConsumer(r.mw, func(ctx context.Context, tx *sql.Tx, ds []*redisstream.Delivery) error {
		for _, d := range ds {
			key, _ := d.Field(redisstream.DefaultKeyField)
			if err := r.effect(ctx, tx, key); err != nil {
				return err
			}
		}
		return nil
	}, redisstream.WithTracer(r.tr), redisstream.WithObserver(r.observer()), redisstream.WithBatchSize(n))
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, "consumer", func(ctx context.Context) error { return c.Run(ctx, rdb, stream, "shipping") })
	if a, _ := r.settled(t, n); a != n {
		t.Fatalf("%d applied, want %d", a, n)
	}
	r.wantBatches(t, reqs, n, 1)
	if p := r.spansWhere(func(s tracetest.SpanStub) bool { return s.SpanKind == trace.SpanKindConsumer })[0]; len(p.Links) != n ||
		spanAttrs(p.Attributes)["messaging.system"] != "redis" || p.Name != "process "+stream {
		t.Errorf("consumer span %q, %d links, attributes %v; want process %s, %d links, system redis", p.Name, len(p.Links), spanAttrs(p.Attributes), stream, n)
	}
}

func TestTraceThroughKafka(t *testing.T) {
	t.Parallel()
	r := newTraceRig(t)
	topic := uniqueName("orders")
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	if err := kafka.EnsureSchema(context.Background(), r.db, r.schema+".kafka_offsets"); err != nil {
		t.Fatal(err)
	}
	c, err := kafka.NewConsumer(r.mw, func(ctx context.Context, tx *sql.Tx, rec *kgo.Record) error {
		return r.effect(ctx, tx, string(rec.Key))
	}, kafka.WithOffsetsTable(r.schema+".kafka_offsets"), kafka.WithTracer(r.tr), kafka.WithObserver(r.observer()))
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, "consumer", func(ctx context.Context) error {
		return c.Run(ctx, kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup(uniqueName("g")), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	})
	key, req := only(t, r.produce(t, 1))
	r.relay(t, twice(func(ctx context.Context, m outbox.Message) error {
		rec := &kgo.Record{Topic: topic, Key: []byte(m.IdempotencyKey), Value: m.Payload,
			Headers: []kgo.RecordHeader{{Key: kafka.DefaultKeyHeader, Value: []byte(m.IdempotencyKey)}}}
		for _, k := range slices.Sorted(maps.Keys(m.Trace)) {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: k, Value: []byte(m.Trace[k])})
		}
		return prod.ProduceSync(ctx, rec).FirstErr()
	}))
	if a, d := r.settled(t, 2); a != 1 || d != 1 {
		t.Fatalf("%d applied, %d duplicates; want 1 and 1", a, d)
	}
	r.wantChain(t, req, key, "kafka", topic)
}

// TestTraceThroughNATS relays with the nats package's own Sender, which
// puts the trace context in the message's headers. JetStream drops the
// second publish of a Nats-Msg-Id, so the duplicate is a second stream's
// copy: the same message published under another id.
func TestTraceThroughNATS(t *testing.T) {
	t.Parallel()
	url := os.Getenv("IDEMPOTENT_NATS_URL")
	if url == "" {
		url = natsgo.DefaultURL
	}
	nc, err := natsgo.Connect(url)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skipf("no NATS at %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	name := uniqueName("TRACE")
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "shipping", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	r := newTraceRig(t)
	subject := name + ".orders"
	sender, err := idnats.NewSender(js, func(outbox.Message) string { return subject })
	if err != nil {
		t.Fatal(err)
	}
	c, err := idnats.NewConsumer(r.mw, func(ctx context.Context, tx *sql.Tx, m jetstream.Msg) error {
		return r.effect(ctx, tx, m.Headers().Get(jetstream.MsgIDHeader))
	}, idnats.WithTracer(r.tr), idnats.WithObserver(r.observer()), idnats.WithKey(func(m jetstream.Msg) (string, error) {
		return string(m.Data()), nil // the payload, the same in both copies
	}))
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, "consumer", func(ctx context.Context) error { return c.Run(ctx, cons) })
	key, req := only(t, r.produce(t, 1))
	r.relay(t, outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		if err := sender.Send(ctx, m); err != nil {
			return err
		}
		m.IdempotencyKey += "-copy"
		return sender.Send(ctx, m)
	}))
	if a, d := r.settled(t, 2); a != 1 || d != 1 {
		t.Fatalf("%d applied, %d duplicates; want 1 and 1", a, d)
	}
	_ = key // the consumer claims the payload
	r.wantChain(t, req, `{"order":0}`, "nats", subject)
}
