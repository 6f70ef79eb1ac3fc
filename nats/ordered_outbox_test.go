package nats_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	idnats "github.com/txclaim/idempotent/nats"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/postgres"
)

// ledgerEvent is the producer's event: one entry of an account's ledger.
type ledgerEvent struct {
	Account string `json:"account"`
	Seq     int64  `json:"seq"`
}

// TestOutboxOrderReachesAnOrderedConsumer: a producer enqueues each
// account's ledger events with outbox.WithOrder, out of order (each in
// its own transaction, shuffled); the relay sends them through the NATS
// Sender, which carries the ordering key and sequence in the
// Idempotent-Order-Key and Idempotent-Order-Seq headers; a Consumer whose
// Middleware is created WithOrdering applies every account's events once
// each, in sequence order, parking the early ones and leaving none parked.
func TestOutboxOrderReachesAnOrderedConsumer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.OpenPostgres(t, 8)
	schema := testenv.UniqueName("ordob")
	if _, err := db.Exec("CREATE SCHEMA " + schema + "; CREATE TABLE " + schema + ".audit (account text NOT NULL, seq bigint NOT NULL, pos bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP SCHEMA " + schema + " CASCADE") })
	js := newJS(t, localNATS(t))
	s, stream := newStream(t, js, 1)

	// The producer's outbox rows, shuffled.
	const accounts, seqs = 5, 8
	var events []ledgerEvent
	for a := range accounts {
		for q := int64(1); q <= seqs; q++ {
			events = append(events, ledgerEvent{Account: fmt.Sprintf("account:%d", a), Seq: q})
		}
	}
	rand.Shuffle(len(events), func(i, j int) { events[i], events[j] = events[j], events[i] })
	ob, err := outbox.New(db, "ledger-producer", outbox.WithTable(schema+".outbox"), outbox.WithoutNotify())
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ob.Enqueue(ctx, tx, e.Account+"/"+strconv.FormatInt(e.Seq, 10), "ledger_event", mustJSON(t, e), outbox.WithOrder(e.Account, e.Seq)); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	sender, err := idnats.NewSender(js, func(outbox.Message) string { return stream + ".ledger" })
	if err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(ob, outbox.WithSender("ledger_event", sender), outbox.WithPollInterval(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRelay := context.WithCancel(ctx)
	relayed := make(chan error, 1)
	go func() { relayed <- relay.Run(rctx) }()
	waitFor(t, time.Minute, "every row sent", func() (bool, error) {
		st, err := ob.Stats(ctx)
		return err == nil && st.Pending == 0, err
	})
	stopRelay()
	if err := <-relayed; err != nil {
		t.Fatal(err)
	}

	// On the wire: each message's headers name its account and sequence.
	peek := newConsumer(t, s, "peek", 30*time.Second)
	batch, err := peek.Fetch(len(events), jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	onWire := 0
	for m := range batch.Messages() {
		var e ledgerEvent
		if err := json.Unmarshal(m.Data(), &e); err != nil {
			t.Fatal(err)
		}
		key, seq, err := adapter.ParseOrder(m.Headers().Get(adapter.OrderKeyHeader), m.Headers().Get(adapter.OrderSeqHeader))
		if err != nil || key != e.Account || seq != e.Seq {
			t.Errorf("message of %s/%d carries ordering key %q, sequence %d (%v)", e.Account, e.Seq, key, seq, err)
		}
		onWire++
	}
	if onWire != len(events) {
		t.Fatalf("%d messages on the stream, want %d", onWire, len(events))
	}

	// The ordered consumer.
	apply := func(ctx context.Context, tx *sql.Tx, body []byte) error {
		var e ledgerEvent
		if err := json.Unmarshal(body, &e); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO "+schema+".audit (account, seq, pos) SELECT $1::text, $2, count(*) + 1 FROM "+schema+".audit WHERE account = $1::text", e.Account, e.Seq)
		return err
	}
	mw, err := idempotent.New(db, postgres.New(), "ledger", idempotent.WithTable(schema+".claims"),
		idempotent.WithOrdering(idempotent.Ordering{Release: func(ctx context.Context, tx *sql.Tx, p idempotent.ParkedMessage) error {
			return apply(ctx, tx, p.Payload)
		}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := idnats.NewConsumer(mw, func(ctx context.Context, tx *sql.Tx, m jetstream.Msg) error { return apply(ctx, tx, m.Data()) }, idnats.WithWorkers(4))
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, c, newConsumer(t, s, "ledger", 30*time.Second), "every event applied", func(adapter.Stats) bool {
		return testenv.Count(t, db, schema, "SELECT count(*) FROM "+schema+".audit") == int64(len(events))
	})
	for a := range accounts {
		account := fmt.Sprintf("account:%d", a)
		var got []int64
		rows, err := db.Query("SELECT seq FROM "+schema+".audit WHERE account = $1 ORDER BY pos", account)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var q int64
			if err := rows.Scan(&q); err != nil {
				t.Fatal(err)
			}
			got = append(got, q)
		}
		_ = rows.Close()
		want := make([]int64, seqs)
		for i := range want {
			want[i] = int64(i + 1)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s applied %v, want %v", account, got, want)
		}
	}
	if waiting, err := mw.Waiting(ctx); err != nil || len(waiting) != 0 {
		t.Errorf("left parked: %+v, %v", waiting, err)
	}
}
