package idempotent_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	_ "github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/mocks"
	"github.com/txclaim/idempotent/postgres"
)

// A message that carries its producer-assigned event time is fenced: once it
// is older than the retention window its claim may have been cleaned up, so
// it is refused, before any statement is sent, instead of applied a second
// time. Here on go-sqlmock, with a clock the example moves.
func ExampleMiddleware_ProcessMessage() {
	db, mock, err := mocks.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	now := time.Date(2031, 3, 16, 12, 0, 0, 0, time.UTC)
	mw, err := idempotent.New(db, postgres.New(), "loyalty",
		idempotent.WithRetention(30*24*time.Hour),
		idempotent.WithClock(func() time.Time { return now }))
	if err != nil {
		log.Fatal(err)
	}
	msg := idempotent.Message{
		Key:       "order-completed:9912",
		EventTime: time.Date(2031, 3, 14, 9, 30, 0, 0, time.UTC), // set by the producer, carried in the message
	}
	m := mocks.ForMiddleware(mock, mw)
	m.ExpectAppliedAt(msg.Key, msg.EventTime) // the claim is fenced by the table's retention horizon too
	m.ExpectExec("UPDATE balances SET points = points + $1 WHERE customer_id = $2").
		WithArgs(50, 7).WillReturnResult(sqlmock.NewResult(0, 1))
	m.ExpectCommit()
	// The replay 40 days later sends nothing: no expectation for it.

	deliver := func() {
		outcome, err := mw.ProcessMessage(context.Background(), msg, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "UPDATE balances SET points = points + $1 WHERE customer_id = $2", 50, 7)
			return err
		})
		switch {
		case errors.Is(err, idempotent.ErrBeyondRetention):
			fmt.Println("beyond retention: dead-letter it for a person")
		case err != nil:
			fmt.Println("not acked, the broker redelivers:", err)
		default:
			fmt.Println(outcome) // ack, whether applied or duplicate
		}
	}
	deliver()
	now = now.Add(40 * 24 * time.Hour) // someone replays the dead-letter archive
	deliver()
	fmt.Println("statements as scripted:", mock.ExpectationsWereMet() == nil)
	// Output:
	// applied
	// beyond retention: dead-letter it for a person
	// statements as scripted: true
}

// WrapMessage takes the key and the event time from each decoded message.
func ExampleWrapMessage() {
	type orderCompleted struct {
		EventID    string
		OccurredAt time.Time
		CustomerID int64
		Points     int64
	}
	db, mock, err := mocks.Open()
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		log.Fatal(err)
	}
	handle := idempotent.WrapMessage(mw,
		func(m orderCompleted) (idempotent.Message, error) {
			return idempotent.Message{Key: "order-completed:" + m.EventID, EventTime: m.OccurredAt}, nil
		},
		func(ctx context.Context, tx *sql.Tx, m orderCompleted) error {
			_, err := tx.ExecContext(ctx, "UPDATE balances SET points = points + $1 WHERE customer_id = $2", m.Points, m.CustomerID)
			return err
		})
	occurred := time.Now().Add(-time.Hour)
	mocks.ForMiddleware(mock, mw).ExpectDuplicateAt("order-completed:9912", occurred)

	outcome, err := handle(context.Background(), orderCompleted{EventID: "9912", OccurredAt: occurred, CustomerID: 7, Points: 50})
	fmt.Println(outcome, err)
	// Output:
	// duplicate <nil>
}

// The examples below need a Postgres database (DATABASE_URL), so they are
// compiled but not run by go test; tests/ runs the same calls against a real
// server.

// Cleanup runs from a nightly job on the claim table, with no consumer of
// its own: batches of 10,000 claims, each its own short transaction, until
// none older than the window is left.
func ExampleClaimTable_Cleanup() {
	db, err := sql.Open("postgres", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	table, err := idempotent.NewClaimTable(db, postgres.New(), idempotent.WithRetention(30*24*time.Hour))
	if err != nil {
		log.Fatal(err)
	}
	opts := idempotent.DefaultCleanupOptions()
	opts.Progress = func(p idempotent.CleanupProgress) {
		log.Printf("batch %d: %d deleted (%d in all) in %v", p.Batch, p.Deleted, p.Total, p.Took)
	}
	deleted, err := table.Cleanup(context.Background(), opts) // every consumer's expired claims
	switch {
	case errors.Is(err, idempotent.ErrCleanupBusy):
		log.Printf("another cleanup is running; deleted %d here", deleted)
	case err != nil:
		log.Fatal(err)
	default:
		log.Printf("deleted %d claims", deleted)
	}
}

// A consumer that keeps its claims for a shorter window than the others
// sharing the table cleans its own claims only.
func ExampleClaimTable_CleanupConsumer() {
	db, err := sql.Open("postgres", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	table, err := idempotent.NewClaimTable(db, postgres.New(), idempotent.WithRetention(7*24*time.Hour))
	if err != nil {
		log.Fatal(err)
	}
	deleted, err := table.CleanupConsumer(context.Background(), "analytics", idempotent.DefaultCleanupOptions())
	if err != nil && !errors.Is(err, idempotent.ErrCleanupBusy) {
		log.Fatal(err)
	}
	log.Printf("deleted %d claims of analytics", deleted)
}

// In partitioned mode the claim table is partitioned by the day of each
// message's event time, and old claims leave a whole day at a time.
func ExampleClaimTable_MaintainPartitions() {
	ctx := context.Background()
	db, err := sql.Open("postgres", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	table, err := idempotent.NewClaimTable(db, postgres.New(),
		idempotent.WithRetention(30*24*time.Hour), idempotent.WithDailyPartitions(7))
	if err != nil {
		log.Fatal(err)
	}
	if err := table.EnsureSchema(ctx); err != nil { // creates the table and its days
		log.Fatal(err)
	}
	// Daily, from a scheduler:
	rep, err := table.MaintainPartitions(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, p := range rep.Dropped {
		log.Printf("dropped %s (%s)", p.Name, p.Day.Format(time.DateOnly))
	}
}

// Stats reads the claims per consumer, with the oldest and the newest.
func ExampleClaimTable_Stats() {
	db, err := sql.Open("postgres", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	table, err := idempotent.NewClaimTable(db, postgres.New(), idempotent.WithTable("shop.processed_messages"))
	if err != nil {
		log.Fatal(err)
	}
	stats, err := table.Stats(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range stats {
		log.Printf("%s: %d claims from %s to %s", c.Consumer, c.Claims, c.Oldest.Format(time.RFC3339), c.Newest.Format(time.RFC3339))
	}
}
