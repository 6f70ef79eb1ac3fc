package nats_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/deadletter"
	"github.com/txclaim/idempotent/internal/testenv"
	idnats "github.com/txclaim/idempotent/nats"
	"github.com/txclaim/idempotent/outbox"
)

// TestDeadLetterWorkflow: a message made poison by a broken handler is
// written as an outbox dead letter (then terminated), listed by a
// deadletter.Store with its reason, subject and delivery count, published
// to the dead-letter subject by DeadLetterSender, replayed after the fix
// through ReplaySender with its key and event time and applied once,
// replayed again and a Duplicate, then discarded and recorded.
func TestDeadLetterWorkflow(t *testing.T) {
	ctx := context.Background()
	nc := localNATS(t)
	js := newJS(t, nc)
	s, stream := newStream(t, js, 1)
	durable := "dl-" + strings.ToLower(stream)
	// The consumer takes the orders' subject alone: the dead-letter
	// subject is in the same stream, and a consumer of both would take the
	// published dead letter for an order of its own (applied once the
	// handler is fixed, or dead-lettered again while it is broken).
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	if _, err := s.CreateOrUpdateConsumer(cctx, jetstream.ConsumerConfig{Durable: durable, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: time.Minute, FilterSubject: stream + ".orders"}); err != nil {
		t.Fatal(err)
	}
	l := newLedger(t, testenv.OpenPostgres(t, 4), durable)
	ob := testenv.Outbox(t, l.db, l.schema, durable)
	deadSubject := stream + ".dead"
	dead, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{deadSubject}})
	if err != nil {
		t.Fatal(err)
	}

	var broken atomic.Bool
	broken.Store(true)
	credit := l.handler()
	ev := &events{}
	c := must(t)(idnats.NewConsumer(l.mw, func(ctx context.Context, tx *sql.Tx, m jetstream.Msg) error {
		if broken.Load() {
			return adapter.Poison(errors.New("the ledger refused the order"))
		}
		return credit(ctx, tx, m)
	}, idnats.WithKey(idnats.Header("Order-Key")), idnats.WithDeadLetter(ob, deadSubject), idnats.WithObserver(ev)))
	r := start(t, c, nc.ConnectedUrl(), stream, durable)
	defer func() {
		if err := r.stop(); err != nil {
			t.Error(err)
		}
	}()
	o := order{OrderID: 7, CustomerID: 1, Points: 5}
	at := time.Date(2026, 11, 30, 12, 0, 0, 123456789, time.UTC)
	subject := stream + ".orders"
	publish(t, js, subject, "", mustJSON(t, o), map[string]string{"Order-Key": o.Key(), adapter.EventTimeHeader: adapter.FormatEventTime(at)})
	waitFor(t, time.Minute, "the dead letter", func() (bool, error) { return len(ev.of(adapter.EventDeadLettered)) == 1, nil })

	store, err := deadletter.New(l.db, deadletter.WithTable(l.schema+".outbox"))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	list, _, err := store.List(ctx, deadletter.Filter{Topic: subject})
	if err != nil || len(list) != 1 {
		t.Fatalf("List = %+v, %v; want one dead letter", list, err)
	}
	dl := list[0]
	if dl.Kind != idnats.DeadLetterKind || !strings.Contains(dl.Reason, "the ledger refused the order") || dl.Deliveries != 1 ||
		!dl.EventTime.Equal(at) || dl.Destination != deadSubject || !strings.HasPrefix(dl.Source, stream+"/"+durable+"/") {
		t.Fatalf("dead letter %+v: want kind %s, the reason, 1 delivery, event time %v, destination %s", dl, idnats.DeadLetterKind, at, deadSubject)
	}
	if n, _, err := pending(t, bindConsumer(t, js, stream, durable)); err != nil || n != 0 {
		t.Fatalf("pending %d, %v: the poison message was not terminated", n, err)
	}

	relay, err := outbox.NewRelay(ob, outbox.WithSender(idnats.DeadLetterKind, idnats.DeadLetterSender(js)),
		outbox.WithSender(idnats.ReplayKind, idnats.ReplaySender(js)), outbox.WithPollInterval(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	fctx, fcancel := context.WithTimeout(ctx, time.Minute)
	defer fcancel()
	dm, err := dead.Next(jetstream.FetchContext(fctx))
	if err != nil {
		t.Fatalf("the dead-letter subject: %v", err)
	}
	if h := dm.Headers(); h.Get("Order-Key") != o.Key() || h.Get(idnats.DeadLetterIDHeader) != dl.IdempotencyKey ||
		h.Get(adapter.EventTimeHeader) != adapter.FormatEventTime(at) || !strings.Contains(h.Get(idnats.DeadLetterErrorHeader), "refused") {
		t.Fatalf("dead letter published with headers %v", h)
	}

	broken.Store(false)
	for i, want := range []adapter.EventType{adapter.EventApplied, adapter.EventDuplicate} {
		if _, err := store.Replay(ctx, deadletter.Filter{IDs: []int64{dl.ID}}, "ops"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "the replay settled", func() (bool, error) {
			return len(ev.of(adapter.EventApplied))+len(ev.of(adapter.EventDuplicate)) == i+1, nil
		})
		if got := ev.of(want); len(got) != 1 || got[0].Message.Key != o.Key() || !got[0].Message.EventTime.Equal(at) {
			t.Fatalf("replay %d: %v events %+v; want one for %s at %v", i+1, want, got, o.Key(), at)
		}
	}
	l.audit(t, []order{o})

	if _, err := store.Discard(ctx, deadletter.Filter{IDs: []int64{dl.ID}}, "ops"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.Show(ctx, dl.ID); !errors.Is(err, deadletter.ErrNotFound) {
		t.Fatalf("Show after Discard: %v, want ErrNotFound", err)
	}
	hist, err := store.History(ctx, dl.ID)
	if err != nil || len(hist) != 3 || hist[0].Action != "replay" || hist[2].Action != "discard" || hist[2].Actor != "ops" {
		t.Fatalf("History = %+v, %v; want two replays and a discard by ops", hist, err)
	}
}

// TestDeadLetterRefused: WithDeadLetter's bad input and its combination
// with WithTenant are refused at construction.
func TestDeadLetterRefused(t *testing.T) {
	l := newLedger(t, testenv.OpenPostgres(t, 2), "dl-refused")
	ob := testenv.Outbox(t, l.db, l.schema, "dl-refused")
	h := l.handler()
	for name, opt := range map[string]idnats.Option{"nil outbox": idnats.WithDeadLetter(nil, "dead"), "empty subject": idnats.WithDeadLetter(ob, "")} {
		if _, err := idnats.NewConsumer(l.mw, h, opt); err == nil || !strings.Contains(err.Error(), "WithDeadLetter") {
			t.Errorf("%s: %v, want an error naming WithDeadLetter", name, err)
		}
	}
}
