package watermill_test

import (
	"context"
	"database/sql"
	"log"
	"os"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/postgres"
	idwm "github.com/txclaim/idempotent/watermill"
)

// A loyalty service credits points for each OrderCompleted exactly once,
// keyed by the producer's idempotency_key metadata.
func ExampleNew() {
	ctx := context.Background()
	db, err := sql.Open("postgres", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotent.New(db, postgres.New(), "loyalty")
	if err != nil {
		log.Fatal(err)
	}
	if err := mw.EnsureSchema(ctx); err != nil {
		log.Fatal(err)
	}
	exactlyOnce, err := idwm.New(mw)
	if err != nil {
		log.Fatal(err)
	}
	pubsub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	poison, err := middleware.PoisonQueueWithFilter(pubsub, "orders.poison", idwm.IsPoison)
	if err != nil {
		log.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	router.AddNoPublisherHandler("loyalty", "orders", pubsub, func(msg *message.Message) error {
		tx := idwm.TxFromContext(msg.Context())
		_, err := tx.ExecContext(msg.Context(), "UPDATE balances SET points = points + 10 WHERE customer_id = $1", msg.Metadata.Get("customer_id"))
		return err
	}).AddMiddleware(poison, exactlyOnce)
	log.Println(router.Run(ctx))
}

// The events a handler returns go out through the outbox, written in the
// claim's transaction and relayed with a stable identity.
func ExampleWithOutbox() {
	ctx := context.Background()
	var db *sql.DB                // opened as above
	var mw *idempotent.Middleware // as above
	var pub message.Publisher     // any Watermill publisher
	ob, err := outbox.New(db, mw.Consumer())
	if err != nil {
		log.Fatal(err)
	}
	exactlyOnce, err := idwm.New(mw, idwm.WithOutbox(ob, "points_awarded"))
	if err != nil {
		log.Fatal(err)
	}
	_ = exactlyOnce // router.AddHandler(…).AddMiddleware(exactlyOnce)
	relay, err := outbox.NewRelay(ob, outbox.WithSender("points_awarded", idwm.NewSender(pub, "points")))
	if err != nil {
		log.Fatal(err)
	}
	log.Println(relay.Run(ctx))
}
