package kafka_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/deadletter"
	"github.com/txclaim/idempotent/kafka"
	"github.com/txclaim/idempotent/outbox"
)

// TestDeadLetterWorkflow: a consumer whose handler is broken dead-letters
// two records through the outbox; the dead letters are listed (reason, key
// header, event time), paged; after the fix one is replayed from its id
// and applied once, replayed again and answered Duplicate; the other is
// discarded: gone from the list, its discard recorded. Bad filters and
// unknown ids change nothing.
func TestDeadLetterWorkflow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := openDB(t, 8)
	s := schema(t, db)
	mw := newMiddleware(t, db, s, "dlops")
	ob := newOutbox(t, db, s, "dlops")
	if _, err := db.Exec(`INSERT INTO ` + s + `.accounts (id) VALUES ('acct')`); err != nil {
		t.Fatal(err)
	}
	cluster := newCluster(t, 1, "in", "in-dlq")
	prod := producer(t, cluster)
	var broken atomic.Bool
	broken.Store(true)
	c, err := kafka.NewConsumer(mw, kafka.Decode(kafka.JSON[payment], func(ctx context.Context, tx *sql.Tx, p payment, _ *kgo.Record) error {
		if broken.Load() {
			return adapter.Poison(errors.New("the ledger refused the payment"))
		}
		return applyPayment(ctx, tx, s, "m", p)
	}), kafka.WithOffsetsTable(s+".kafka_offsets"), kafka.WithDeadLetter(ob, "in-dlq"),
		kafka.WithEventTime(kafka.TimeHeader("occurred-at")))
	if err != nil {
		t.Fatal(err)
	}
	// The event time comes from a header of the producer's own: a replay
	// carries the one the consumer read in adapter.EventTimeHeader.
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	occurred := kgo.RecordHeader{Key: "occurred-at", Value: []byte(at.Format(time.RFC3339))}
	if err := prod.ProduceSync(ctx, paymentRecord("in", "p-1", occurred), paymentRecord("in", "p-2", occurred)).FirstErr(); err != nil {
		t.Fatal(err)
	}
	m := startMember(c, "m", kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumerGroup("dlops"), kgo.ConsumeTopics("in"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
	defer m.stop(t)
	waitFor(t, "both records dead-lettered", func() (bool, error) { return storedOffsets(t, db, s, "dlops", "in")[0] == 2, nil })
	relay, err := outbox.NewRelay(ob, outbox.WithSender(kafka.DeadLetterKind, kafka.DeadLetterSender(prod)),
		outbox.WithSender(kafka.ReplayKind, kafka.ReplaySender(prod)), outbox.WithPollInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	rdone := make(chan error, 1)
	go func() { rdone <- relay.Run(rctx) }()
	defer func() {
		rcancel()
		if err := <-rdone; err != nil {
			t.Errorf("relay: %v", err)
		}
	}()
	readRecords(t, cluster, "in-dlq", 2)

	store, err := deadletter.New(db, deadletter.WithTable(s+".outbox"))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	list, next, err := store.List(ctx, deadletter.Filter{Consumer: "dlops", Topic: "in", Reason: "ledger refused"})
	if err != nil || len(list) != 2 || next != 0 {
		t.Fatalf("List = %d dead letters, next %d, %v; want 2, 0", len(list), next, err)
	}
	for i, d := range list {
		want := []string{"p-1", "p-2"}[i]
		if d.Kind != kafka.DeadLetterKind || d.Topic != "in" || d.Destination != "in-dlq" || d.State != "sent" ||
			!strings.Contains(d.Reason, "the ledger refused the payment") || !d.EventTime.Equal(at) || d.Key != d.Source {
			t.Errorf("dead letter %d: %+v", i, d)
		}
		if !hasHeader(d.Headers, kafka.DefaultKeyHeader, want) || !strings.Contains(string(d.Payload), want) {
			t.Errorf("dead letter %d: headers %v payload %s, want the record's (key %s)", i, d.Headers, d.Payload, want)
		}
	}
	page, next, err := store.List(ctx, deadletter.Filter{Limit: 1})
	if err != nil || len(page) != 1 || next != list[0].ID {
		t.Fatalf("first page = %d, next %d, %v", len(page), next, err)
	}
	if page, next, err = store.List(ctx, deadletter.Filter{Limit: 1, After: next}); err != nil || len(page) != 1 || page[0].ID != list[1].ID || next != 0 {
		t.Fatalf("second page = %v, next %d, %v", page, next, err)
	}
	if got, _, err := store.List(ctx, deadletter.Filter{Topic: "other"}); err != nil || len(got) != 0 {
		t.Fatalf("List of another topic = %d, %v", len(got), err)
	}

	// Bad input changes nothing.
	before := auditAndOutbox(t, db, s)
	for _, bad := range []struct {
		f     deadletter.Filter
		actor string
		want  error
	}{
		{deadletter.Filter{}, "ops", deadletter.ErrInvalidFilter},
		{deadletter.Filter{IDs: []int64{list[0].ID}}, " ", deadletter.ErrInvalidFilter},
		{deadletter.Filter{IDs: []int64{list[0].ID, 1 << 40}}, "ops", deadletter.ErrNotFound},
		{deadletter.Filter{IDs: []int64{-1}}, "ops", deadletter.ErrInvalidFilter},
		{deadletter.Filter{Consumer: "dlops", From: at, Before: at}, "ops", deadletter.ErrInvalidFilter},
	} {
		if _, err := store.Replay(ctx, bad.f, bad.actor); !errors.Is(err, bad.want) {
			t.Errorf("Replay(%+v, %q) = %v, want %v", bad.f, bad.actor, err, bad.want)
		}
		if _, err := store.Discard(ctx, bad.f, bad.actor); !errors.Is(err, bad.want) {
			t.Errorf("Discard(%+v, %q) = %v, want %v", bad.f, bad.actor, err, bad.want)
		}
	}
	if after := auditAndOutbox(t, db, s); after != before {
		t.Fatalf("bad input changed the tables: %s, was %s", after, before)
	}

	// The fix, then a replay of p-1: applied once.
	broken.Store(false)
	done, err := store.Replay(ctx, deadletter.Filter{IDs: []int64{list[0].ID}}, "ops@example")
	if err != nil || len(done) != 1 || done[0].ReplayKind != kafka.ReplayKind || done[0].ReplayKey == "" {
		t.Fatalf("Replay = %+v, %v", done, err)
	}
	waitFor(t, "the replay consumed", func() (bool, error) { return storedOffsets(t, db, s, "dlops", "in")[0] == 3, nil })
	if st, n := c.Stats(), ledgerRows(t, db, s); st.Applied != 1 || st.Duplicates != 0 || n != 1 {
		t.Fatalf("after the replay: stats %+v, %d ledger rows; want 1 applied and 1 row", st, n)
	}
	// Again: the same key and event time, a Duplicate.
	if _, err := store.Replay(ctx, deadletter.Filter{Key: list[0].Key}, "ops@example"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second replay consumed", func() (bool, error) { return storedOffsets(t, db, s, "dlops", "in")[0] == 4, nil })
	if st, n := c.Stats(), ledgerRows(t, db, s); st.Applied != 1 || st.Duplicates != 1 || n != 1 {
		t.Fatalf("after the second replay: stats %+v, %d ledger rows; want 1 applied, 1 duplicate and 1 row", st, n)
	}
	for _, r := range readRecords(t, cluster, "in", 4)[2:] {
		h := map[string]string{}
		for _, x := range r.Headers {
			h[x.Key] = string(x.Value)
		}
		if h[kafka.DefaultKeyHeader] != "p-1" || h[adapter.EventTimeHeader] != adapter.FormatEventTime(at) || h[kafka.ReplayIDHeader] == "" {
			t.Errorf("replayed record at offset %d has headers %v, want p-1's key, its event time %s and a replay id", r.Offset, h, adapter.FormatEventTime(at))
		}
	}
	_, hist, err := store.Show(ctx, list[0].ID)
	if err != nil || len(hist) != 2 || hist[0].Action != "replay" || hist[0].Actor != "ops@example" || hist[0].ReplayKey == hist[1].ReplayKey {
		t.Fatalf("Show's history = %+v, %v; want two replays by ops@example, each its own key", hist, err)
	}

	// Discard p-2: gone, recorded.
	if done, err := store.Discard(ctx, deadletter.Filter{IDs: []int64{list[1].ID}}, "ops@example"); err != nil || len(done) != 1 {
		t.Fatalf("Discard = %+v, %v", done, err)
	}
	if _, _, err := store.Show(ctx, list[1].ID); !errors.Is(err, deadletter.ErrNotFound) {
		t.Errorf("Show of a discarded dead letter: %v, want ErrNotFound", err)
	}
	if got, _, err := store.List(ctx, deadletter.Filter{}); err != nil || len(got) != 1 || got[0].ID != list[0].ID {
		t.Errorf("List after the discard = %v, %v; want p-1's only", got, err)
	}
	hist, err = store.History(ctx, list[1].ID)
	if err != nil || len(hist) != 1 || hist[0].Action != "discard" || hist[0].Actor != "ops@example" || !strings.Contains(hist[0].Reason, "ledger refused") {
		t.Errorf("history of the discarded one = %+v, %v", hist, err)
	}
}

func hasHeader(hs []deadletter.Header, k, v string) bool {
	for _, h := range hs {
		if h.Key == k && h.Value == v {
			return true
		}
	}
	return false
}

// auditAndOutbox summarizes the outbox and audit tables of schema s.
func auditAndOutbox(t *testing.T, db *sql.DB, s string) string {
	t.Helper()
	var out string
	if err := db.QueryRow(`SELECT (SELECT count(*) || ' rows, max id ' || COALESCE(max(id), 0) FROM ` + s + `.outbox) || '; audit ' ||
		(SELECT count(*) FROM ` + s + `.outbox_dead_letter_audit)`).Scan(&out); err != nil {
		t.Fatal(err)
	}
	return out
}
