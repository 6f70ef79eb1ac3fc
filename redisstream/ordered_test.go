package redisstream_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/redisstream"
)

// orderedEntry adds an entry with the ordering fields of entity's
// sequence seq (as given, unparsed), the key key, the payload payload and
// the extra fields.
func orderedEntry(t testing.TB, rdb *redis.Client, stream, key, entity, seq, payload string, extra ...any) {
	t.Helper()
	vals := append([]any{redisstream.DefaultKeyField, key, redisstream.PayloadField, payload,
		adapter.OrderKeyHeader, entity, adapter.OrderSeqHeader, seq}, extra...)
	if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: vals}).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestOrderedParkedEntryKeepsFields: an entry that arrives before its
// predecessor is parked with every field, not only its payload and the
// library's: released through ParkedDelivery, the handler reads its own
// field ("kind") as it read it from the stream, after its predecessor.
func TestOrderedParkedEntryKeepsFields(t *testing.T) {
	t.Parallel()
	db := testenv.OpenPostgres(t, 4)
	var l *ledger
	type applied struct{ seq, kind, payload string }
	var got []applied
	handle := func(ctx context.Context, tx *sql.Tx, d *redisstream.Delivery) error {
		seq, _ := d.Field(adapter.OrderSeqHeader)
		kind, _ := d.Field("kind")
		_, err := tx.ExecContext(ctx, "INSERT INTO "+l.schema+".kinds (seq, kind, payload) VALUES ($1, $2, $3)", seq, kind, string(d.Payload()))
		return err
	}
	l = newLedger(t, db, "ordered", idempotent.WithOrdering(idempotent.Ordering{
		Release: func(ctx context.Context, tx *sql.Tx, p idempotent.ParkedMessage) error {
			return handle(ctx, tx, redisstream.ParkedDelivery(p))
		},
	}))
	if _, err := db.Exec("CREATE TABLE " + l.schema + ".kinds (pos serial PRIMARY KEY, seq text NOT NULL, kind text NOT NULL, payload text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	admin := newClient(t, redisAddr())
	stream := newStream(t, admin, group)
	orderedEntry(t, admin, stream, "acct-2", "acct", "2", `{"debit":5}`, "kind", "debit")
	orderedEntry(t, admin, stream, "acct-1", "acct", "1", `{"credit":10}`, "kind", "credit")

	var ev events
	c, err := redisstream.NewConsumer(l.mw, handle, redisstream.WithObserver(&ev), redisstream.WithBlock(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	r := start(c, admin, stream, group)
	waitFor(t, 10*time.Second, "both entries settled", func() bool { return len(ev.of(adapter.EventApplied)) == 2 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query("SELECT seq, kind, payload FROM " + l.schema + ".kinds ORDER BY pos")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var a applied
		if err := rows.Scan(&a.seq, &a.kind, &a.payload); err != nil {
			t.Fatal(err)
		}
		got = append(got, a)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []applied{{"1", "credit", `{"credit":10}`}, {"2", "debit", `{"debit":5}`}}
	if !slices.Equal(got, want) {
		t.Errorf("applied %+v, want %+v (the parked entry released with every field, after its predecessor)", got, want)
	}
	if n := pending(t, admin, stream); n != 0 {
		t.Errorf("%d entries pending, want both acknowledged", n)
	}
}

// TestOrderedBadFields: an entry whose ordering fields cannot be used — a
// sequence that is not a number, a sequence 0, an ordering key without a
// sequence — is poison: dropped (no dead-letter outbox) with an error
// matching idempotent.ErrInvalidOrder that names the field, acknowledged,
// and nothing is written: no claim, no sequence row, nothing parked, no
// effect. The good entry after them applies, per message and in batches.
func TestOrderedBadFields(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			t.Parallel()
			db := testenv.OpenPostgres(t, 4)
			l := newLedger(t, db, "ordered", idempotent.WithOrdering(idempotent.Ordering{
				Release: func(context.Context, *sql.Tx, idempotent.ParkedMessage) error { return errors.New("nothing may park") },
			}))
			admin := newClient(t, redisAddr())
			stream := newStream(t, admin, group)
			orderedEntry(t, admin, stream, "bad-nan", "acct", "x", `{}`)
			orderedEntry(t, admin, stream, "bad-zero", "acct", "0", `{}`)
			if err := admin.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: []any{
				redisstream.DefaultKeyField, "bad-noseq", redisstream.PayloadField, `{}`, adapter.OrderKeyHeader, "acct",
			}}).Err(); err != nil {
				t.Fatal(err)
			}
			orderedEntry(t, admin, stream, "good", "acct", "1", `{}`)
			var handled []string
			one := func(_ context.Context, _ *sql.Tx, d *redisstream.Delivery) error {
				k, _ := d.Field(redisstream.DefaultKeyField)
				handled = append(handled, k)
				return nil
			}
			var ev events
			opts := []redisstream.Option{redisstream.WithObserver(&ev), redisstream.WithBlock(20 * time.Millisecond)}
			var c *redisstream.Consumer
			var err error
			if batch {
				c, err = redisstream.NewBatchConsumer(l.mw, func(ctx context.Context, tx *sql.Tx, ds []*redisstream.Delivery) error {
					for _, d := range ds {
						if err := one(ctx, tx, d); err != nil {
							return err
						}
					}
					return nil
				}, opts...)
			} else {
				c, err = redisstream.NewConsumer(l.mw, one, opts...)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := start(c, admin, stream, group)
			waitFor(t, 10*time.Second, "four entries settled", func() bool {
				return len(ev.of(adapter.EventDeadLettered))+len(ev.of(adapter.EventApplied)) == 4
			})
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(handled, []string{"good"}) {
				t.Errorf("handled %v, want only the good entry", handled)
			}
			dead := ev.of(adapter.EventDeadLettered)
			if len(dead) != 3 {
				t.Fatalf("%d entries dropped, want the 3 bad ones", len(dead))
			}
			for _, e := range dead {
				if !errors.Is(e.Err, idempotent.ErrInvalidOrder) {
					t.Errorf("entry %s dropped with %v, want ErrInvalidOrder", e.Source, e.Err)
				}
				t.Logf("dropped: %v", e.Err)
			}
			for table, want := range map[string]int{"processed_messages": 1, "processed_messages_order_seq": 1, "processed_messages_order_parked": 0} {
				var n int
				if err := db.QueryRow("SELECT COUNT(*) FROM " + l.schema + "." + table).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != want {
					t.Errorf("%s holds %d rows, want %d (the good entry's only)", table, n, want)
				}
			}
			if n := pending(t, admin, stream); n != 0 {
				t.Errorf("%d entries pending, want every one acknowledged", n)
			}
		})
	}
}
