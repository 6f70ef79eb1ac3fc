package deadletter_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	"github.com/txclaim/idempotent/deadletter"
)

// An operator's tool: list the Kafka dead letters of one topic that died
// for one reason, then replay them once the handler is fixed. A Relay with
// kafka.ReplaySender registered for kafka.ReplayKind sends the replays.
func Example() {
	var db *sql.DB // the outbox's Postgres database
	ctx := context.Background()
	store, err := deadletter.New(db, deadletter.WithTable("app.outbox"))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.EnsureSchema(ctx); err != nil { // the audit table
		log.Fatal(err)
	}
	f := deadletter.Filter{Topic: "payments", Reason: "account is frozen"}
	dls, _, err := store.List(ctx, f)
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range dls {
		fmt.Println(d.ID, d.Source, d.EventTime, d.Reason)
	}
	actions, err := store.Replay(ctx, f, "alice")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(actions), "replayed")
}
