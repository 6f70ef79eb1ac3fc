package idempgx_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idempgx"
)

// WithOrdering applies one account's ledger events in the producer's
// order, whatever order they arrive in: event 2 arrives first and waits in
// the parking table; event 1 applies, and releases it in its transaction.
func ExampleWithOrdering() {
	pool, schema, done := examplePool()
	defer done()
	ctx := context.Background()
	credit := func(ctx context.Context, tx pgx.Tx, points []byte) error {
		_, err := tx.Exec(ctx, "UPDATE "+schema+".balances SET points = points * 2 + $1::text::bigint WHERE customer_id = 42", string(points))
		return err
	}
	m, err := idempgx.New(pool, "ledger", idempgx.WithTable(schema+".processed_messages"),
		idempgx.WithOrdering(idempgx.Ordering{
			Release: func(ctx context.Context, tx pgx.Tx, p idempotent.ParkedMessage) error {
				return credit(ctx, tx, p.Payload)
			},
		}))
	if err != nil {
		log.Fatal(err)
	}
	if err := m.EnsureSchema(ctx); err != nil {
		log.Fatal(err)
	}
	for _, e := range []struct {
		key    string
		seq    int64
		points string
	}{{"evt-2", 2, "3"}, {"evt-1", 1, "5"}, {"evt-2", 2, "3"}} {
		msg := idempotent.Message{Key: e.key, OrderKey: "account:42", OrderSeq: e.seq, Payload: []byte(e.points)}
		out, err := m.ProcessMessage(ctx, msg, func(ctx context.Context, tx pgx.Tx) error { return credit(ctx, tx, msg.Payload) })
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(e.key, out)
	}
	var p int64
	if err := pool.QueryRow(ctx, "SELECT points FROM "+schema+".balances WHERE customer_id = 42").Scan(&p); err != nil {
		log.Fatal(err)
	}
	// (0*2+5)*2+3 = 13 in order; (0*2+3)*2+5 = 11 out of order.
	fmt.Println("points:", p)
	// Output:
	// evt-2 parked
	// evt-1 applied
	// evt-2 duplicate
	// points: 13
}
