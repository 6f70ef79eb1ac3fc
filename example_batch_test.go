package idempotent_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
)

type orderCompleted struct {
	OrderID, CustomerID, Points int64
}

// A batch consumer (Kafka, or RabbitMQ with a prefetch) claims a whole batch
// in one transaction, applies the new messages' effects set-wise, and
// commits once.
func ExampleWrapBatch() {
	db, schema, drop := exampleDB()
	defer drop()
	ctx := context.Background()
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(schema+".processed_messages"))
	if err != nil {
		log.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		log.Fatal(err)
	}

	process := idempotent.WrapBatch(mw,
		func(o orderCompleted) (string, error) { return fmt.Sprintf("order-completed:%d", o.OrderID), nil },
		func(ctx context.Context, tx *sql.Tx, msgs []orderCompleted) error {
			// Only the new messages arrive here; one UPDATE for all of them.
			var customers, points []int64
			for _, o := range msgs {
				customers, points = append(customers, o.CustomerID), append(points, o.Points)
			}
			_, err := tx.ExecContext(ctx, "UPDATE "+pq.QuoteIdentifier(schema)+".balances b SET points = b.points + u.p "+
				"FROM (SELECT c, sum(p) AS p FROM unnest($1::bigint[], $2::bigint[]) AS u(c, p) GROUP BY c) u WHERE b.customer_id = u.c",
				pq.Array(customers), pq.Array(points))
			return err
		})

	first := []orderCompleted{{9912, 7, 50}, {9913, 8, 20}, {9912, 7, 50}}
	outcomes, err := process(ctx, first)
	fmt.Println(outcomes, err)
	// The broker redelivers the batch with one new message.
	outcomes, err = process(ctx, append(first, orderCompleted{9914, 7, 5}))
	fmt.Println(outcomes, err)

	var p7, p8 int64
	if err := db.QueryRow("SELECT (SELECT points FROM "+pq.QuoteIdentifier(schema)+".balances WHERE customer_id = 7), "+
		"(SELECT points FROM "+pq.QuoteIdentifier(schema)+".balances WHERE customer_id = 8)").Scan(&p7, &p8); err != nil {
		log.Fatal(err)
	}
	fmt.Println("customer 7:", p7, "customer 8:", p8)
	// Output:
	// [applied applied duplicate] <nil>
	// [duplicate duplicate duplicate applied] <nil>
	// customer 7: 55 customer 8: 20
}

// ProcessBatch works on keys and message indexes, for consumers that keep
// their messages in their own structures.
func ExampleMiddleware_ProcessBatch() {
	db, schema, drop := exampleDB()
	defer drop()
	ctx := context.Background()
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(schema+".processed_messages"))
	if err != nil {
		log.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		log.Fatal(err)
	}
	keys := []string{"evt-3", "evt-1", "evt-3", "evt-2"}
	outcomes, err := mw.ProcessBatch(ctx, keys, func(ctx context.Context, tx *sql.Tx, fresh []int) error {
		fmt.Println("new messages at", fresh)
		return nil // apply the effects of keys[i] for each i in fresh, through tx
	})
	fmt.Println(outcomes, err)
	// Output:
	// new messages at [0 1 3]
	// [applied applied duplicate applied] <nil>
}
