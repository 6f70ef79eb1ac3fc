package idempotent_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/mocks"
	"github.com/txclaim/idempotent/postgres"
)

type orderCompleted struct {
	OrderID, CustomerID, Points int64
}

// expectBatchClaim scripts the Postgres dialect's one-statement batch claim
// of keys (distinct, ascending: the order the middleware sends them in),
// returning the keys whose claims were new.
func expectBatchClaim(mock sqlmock.Sqlmock, keys string, fresh ...string) {
	table, err := dialect.ParseTable("processed_messages")
	if err != nil {
		log.Fatal(err)
	}
	rows := sqlmock.NewRows([]string{"message_key"})
	for _, k := range fresh {
		rows.AddRow(k)
	}
	mock.ExpectQuery(postgres.New().BatchClaimSQL(table)).WithArgs("loyalty", keys).WillReturnRows(rows)
}

const batchCreditSQL = "UPDATE balances b SET points = b.points + u.p " +
	"FROM (SELECT c, sum(p) AS p FROM unnest($1::bigint[], $2::bigint[]) AS u(c, p) GROUP BY c) u WHERE b.customer_id = u.c"

// A batch consumer (Kafka, or RabbitMQ with a prefetch) claims a whole batch
// in one statement, applies the new messages' effects set-wise, and commits
// once. A message repeated within the batch, or claimed by an earlier batch,
// is a duplicate; when every message is a duplicate the handler does not run.
func ExampleWrapMessages() {
	db, mock, err := mocks.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		log.Fatal(err)
	}

	process := idempotent.WrapMessages(mw,
		func(o orderCompleted) (idempotent.Message, error) {
			return idempotent.Message{Key: fmt.Sprintf("order-completed:%d", o.OrderID)}, nil
		},
		func(ctx context.Context, tx *sql.Tx, msgs []orderCompleted) error {
			// Only the new messages arrive here; one UPDATE for all of them.
			var customers, points []int64
			for _, o := range msgs {
				customers, points = append(customers, o.CustomerID), append(points, o.Points)
			}
			fmt.Println("crediting", len(msgs), "orders")
			_, err := tx.ExecContext(ctx, batchCreditSQL, pq.Array(customers), pq.Array(points))
			return err
		})

	// The first batch: both orders are new.
	mock.ExpectBegin()
	expectBatchClaim(mock, `{"order-completed:9912","order-completed:9913"}`,
		"order-completed:9912", "order-completed:9913")
	mock.ExpectExec(batchCreditSQL).WithArgs("{7,8}", "{50,20}").WillReturnResult(sqlmock.NewResult(0, 2))
	mock.ExpectCommit()
	// The broker redelivers it with one new message: only 9914 is new.
	mock.ExpectBegin()
	expectBatchClaim(mock, `{"order-completed:9912","order-completed:9913","order-completed:9914"}`,
		"order-completed:9914")
	mock.ExpectExec(batchCreditSQL).WithArgs("{7}", "{5}").WillReturnResult(sqlmock.NewResult(0, 1))
	mock.ExpectCommit()

	first := []orderCompleted{{9912, 7, 50}, {9913, 8, 20}, {9912, 7, 50}}
	fmt.Println(process(context.Background(), first))
	fmt.Println(process(context.Background(), append(first, orderCompleted{9914, 7, 5})))
	fmt.Println("statements as scripted:", mock.ExpectationsWereMet() == nil)
	// Output:
	// crediting 2 orders
	// [applied applied duplicate] <nil>
	// crediting 1 orders
	// [duplicate duplicate duplicate applied] <nil>
	// statements as scripted: true
}

// ProcessMessages works on message indexes, for consumers that keep their
// messages in their own structures: fn gets the indexes of the new
// messages, in batch order. These messages have no event times.
func ExampleMiddleware_ProcessMessages_indexes() {
	db, mock, err := mocks.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		log.Fatal(err)
	}

	mock.ExpectBegin()
	expectBatchClaim(mock, `{"evt-1","evt-2","evt-3"}`, "evt-1", "evt-2", "evt-3")
	mock.ExpectCommit()

	msgs := []idempotent.Message{{Key: "evt-3"}, {Key: "evt-1"}, {Key: "evt-3"}, {Key: "evt-2"}}
	outcomes, err := mw.ProcessMessages(context.Background(), msgs, func(ctx context.Context, tx *sql.Tx, fresh []int) error {
		fmt.Println("new messages at", fresh)
		return nil // apply the effects of msgs[i] for each i in fresh, through tx
	})
	fmt.Println(outcomes, err)
	fmt.Println("statements as scripted:", mock.ExpectationsWereMet() == nil)
	// Output:
	// new messages at [0 1 3]
	// [applied applied duplicate applied] <nil>
	// statements as scripted: true
}

// ProcessMessages is the batch with event times: each message passes the
// retention fence, and in partitioned mode each claim goes into its own
// event day's partition, so a batch may span days. A message outside the
// retention window refuses the whole batch before anything is sent, naming
// its index: set it aside and process the rest.
func ExampleMiddleware_ProcessMessages() {
	db, mock, err := mocks.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	now := time.Date(2031, 3, 16, 12, 0, 0, 0, time.UTC)
	mw, err := idempotent.New(db, postgres.New(), "loyalty",
		idempotent.WithDailyPartitions(7),
		idempotent.WithClock(func() time.Time { return now }))
	if err != nil {
		log.Fatal(err)
	}
	table, err := dialect.ParseTable("processed_messages")
	if err != nil {
		log.Fatal(err)
	}
	// One claim statement for the batch: the keys in ascending order, each
	// with its event day; it returns the keys whose claims were new. Then
	// the table's retention horizon, read in the same transaction: none
	// recorded (no day dropped yet), so no new claim is refused.
	pg := postgres.New()
	mock.ExpectBegin()
	mock.ExpectQuery(pg.PartitionedBatchClaimSQL(table)).
		WithArgs("loyalty", pg.BatchKeysArg([]string{"evt-1", "evt-2"}), pg.BatchKeysArg([]string{"2031-03-14", "2031-03-16"})).
		WillReturnRows(sqlmock.NewRows([]string{"message_key"}).AddRow("evt-1"))
	horizon, _ := pg.HorizonSQL(table, "loyalty")
	mock.ExpectQuery(horizon).WithArgs("loyalty").WillReturnRows(sqlmock.NewRows([]string{"horizon"}).AddRow(nil))
	mock.ExpectCommit()

	msgs := []idempotent.Message{
		{Key: "evt-2", EventTime: time.Date(2031, 3, 16, 8, 0, 0, 0, time.UTC)},
		{Key: "evt-1", EventTime: time.Date(2031, 3, 14, 23, 0, 0, 0, time.UTC)},
	}
	apply := func(ctx context.Context, tx *sql.Tx, fresh []int) error {
		fmt.Println("new messages at", fresh)
		return nil // apply the effects of msgs[i] for each i in fresh, through tx
	}
	fmt.Println(mw.ProcessMessages(context.Background(), msgs, apply))

	// A replay from the archive, one message 40 days old: nothing is sent.
	old := append(msgs, idempotent.Message{Key: "evt-0", EventTime: now.AddDate(0, 0, -40)})
	_, err = mw.ProcessMessages(context.Background(), old, apply)
	var bad *idempotent.BatchKeyError
	if errors.As(err, &bad) && errors.Is(err, idempotent.ErrBeyondRetention) {
		fmt.Println("message", bad.Index, "is beyond retention: dead-letter it, process the others again")
	}
	fmt.Println("statements as scripted:", mock.ExpectationsWereMet() == nil)
	// Output:
	// new messages at [1]
	// [duplicate applied] <nil>
	// message 2 is beyond retention: dead-letter it, process the others again
	// statements as scripted: true
}
