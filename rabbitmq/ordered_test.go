package rabbitmq_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/rabbitmq"
)

// TestRabbitMQOrderedPerKey publishes the events of many entities
// shuffled, 30% of them twice, with the ordering headers, to a consumer of
// four workers on a Middleware WithOrdering: every entity's effects apply
// once each, in sequence order (audited in the database), and nothing is
// left parked.
func TestRabbitMQOrderedPerKey(t *testing.T) {
	url := amqpURL(t)
	db := openDB(t, 8)
	schema := newLoyalty(t, db).schema // a schema of the test's own
	audit := schema + ".ordered_audit"
	if _, err := db.Exec("CREATE TABLE " + audit + " (entity text NOT NULL, seq int NOT NULL, pos int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	record := func(ctx context.Context, tx *sql.Tx, entity string, seq int64) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO "+audit+" (entity, seq, pos) SELECT $1, $2, COUNT(*) + 1 FROM "+audit+" WHERE entity = $1", entity, seq)
		return err
	}
	mw, err := idempotent.New(db, postgres.New(), "ordered", idempotent.WithTable(schema+".ordered_claims"),
		idempotent.WithOrdering(idempotent.Ordering{Release: func(ctx context.Context, tx *sql.Tx, p idempotent.ParkedMessage) error {
			if p.Headers[adapter.OrderKeyHeader] != p.OrderKey || string(p.Payload) != p.OrderKey+":"+strconv.FormatInt(p.OrderSeq, 10) {
				return fmt.Errorf("parked message %q came back as payload %q, headers %v", p.Key, p.Payload, p.Headers)
			}
			return record(ctx, tx, p.OrderKey, p.OrderSeq)
		}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	inFlight := map[string]bool{}
	c, err := rabbitmq.NewConsumer(mw, func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		entity, _ := d.Headers[adapter.OrderKeyHeader].(string)
		mu.Lock()
		if inFlight[entity] {
			t.Errorf("entity %s: two deliveries in flight at once on one consumer", entity)
		}
		inFlight[entity] = true
		mu.Unlock()
		defer func() { mu.Lock(); delete(inFlight, entity); mu.Unlock() }()
		seq, _ := strconv.ParseInt(d.Headers[adapter.OrderSeqHeader].(string), 10, 64)
		return record(ctx, tx, entity, seq)
	}, rabbitmq.WithWorkers(4))
	if err != nil {
		t.Fatal(err)
	}

	const entities, perEntity = 30, 8
	rng := rand.New(rand.NewPCG(3, 4))
	var msgs []amqp.Publishing
	for i := range entities {
		entity := fmt.Sprintf("acct%d", i)
		for s := int64(1); s <= perEntity; s++ {
			m := amqp.Publishing{
				MessageId: fmt.Sprintf("%s-%d", entity, s), DeliveryMode: amqp.Transient,
				Body:    []byte(entity + ":" + strconv.FormatInt(s, 10)),
				Headers: amqp.Table{adapter.OrderKeyHeader: entity, adapter.OrderSeqHeader: adapter.FormatOrderSeq(s)},
			}
			msgs = append(msgs, m)
			if rng.IntN(10) < 3 {
				msgs = append(msgs, m)
			}
		}
	}
	rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	top := declareTopology(t, url)
	conn := dialTest(t, url)
	newPublisher(t, conn, top.queue).publish(t, msgs...)
	if err := runUntil(t, c, conn, top.queue, "every delivery settled", func() bool {
		s := c.Stats()
		return s.Applied+s.Duplicates >= int64(len(msgs))
	}); err != nil {
		t.Fatal(err)
	}
	if s := c.Stats(); s.DeadLettered != 0 || s.Requeued != 0 {
		t.Errorf("stats %+v: want nothing dead-lettered or requeued", s)
	}
	for i := range entities {
		entity := fmt.Sprintf("acct%d", i)
		rows, err := db.Query("SELECT seq FROM "+audit+" WHERE entity = $1 ORDER BY pos", entity)
		if err != nil {
			t.Fatal(err)
		}
		var got []int64
		for rows.Next() {
			var s int64
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			got = append(got, s)
		}
		rows.Close()
		want := make([]int64, perEntity)
		for j := range want {
			want[j] = int64(j + 1)
		}
		if !slices.Equal(got, want) {
			t.Errorf("entity %s: effects applied in the order %v, want %v", entity, got, want)
		}
	}
	waiting, err := mw.Waiting(context.Background())
	if err != nil || len(waiting) != 0 {
		t.Errorf("Waiting: %+v, %v; want nothing parked", waiting, err)
	}
}
