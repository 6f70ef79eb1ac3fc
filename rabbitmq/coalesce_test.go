package rabbitmq_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/rabbitmq"
)

// TestCoalescedWorkersShareOneTransaction runs the consumer's workers on
// a Middleware WithCoalescing: four deliveries taken by four workers at
// once share one transaction, and none is acked before that transaction
// committed — an ack waits for the whole group.
func TestCoalescedWorkersShareOneTransaction(t *testing.T) {
	t.Parallel()
	mw, db := newMiddleware(t, idempotent.WithCoalescing(idempotent.Coalescing{Max: 4, Wait: time.Second}))
	f := newFakeChannel()
	var mu sync.Mutex
	txs := map[*sql.Tx]int{}
	c := newConsumer(t, mw, func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error {
		mu.Lock()
		txs[tx]++
		mu.Unlock()
		f.record("handled %d", d.DeliveryTag)
		return effect(ctx, tx, d)
	}, rabbitmq.WithWorkers(4))
	start(t, c, f)
	for i := range 4 {
		f.deliver(amqp.Delivery{MessageId: fmt.Sprintf("order-completed:%d", i)})
	}
	waitFor(t, "four applied", func() bool { return c.Stats().Applied == 4 })
	log := f.log()
	for i, e := range log[:4] {
		if !strings.HasPrefix(e, "handled ") {
			t.Fatalf("event %d of %q is %q: an ack came before every handler of the group ran", i, log, e)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(txs) != 1 {
		t.Fatalf("the handlers ran in %d transactions, want one", len(txs))
	}
	if got := db.committed(); len(got) != 4 {
		t.Fatalf("committed effects %q, want four", got)
	}
}
