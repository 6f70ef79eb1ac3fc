package watermill_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/postgres"
	idwm "github.com/txclaim/idempotent/watermill"
)

// OrderCompleted is the loyalty service's message.
type OrderCompleted struct {
	OrderID    int64 `json:"order_id"`
	CustomerID int64 `json:"customer_id"`
	Points     int64 `json:"points"`
}

// A loyalty service credits points for each OrderCompleted exactly once,
// keyed by the message's UUID, which the producer sets to
// "order-completed:<id>". Every router middleware wraps the whole claim:
// Retry's second run is a new claim, and the poison queue takes poison
// only.
func ExampleNewHandler() {
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
	credit, err := idwm.NewHandler(mw, idwm.Decode(idwm.JSON[OrderCompleted],
		func(ctx context.Context, tx *sql.Tx, o OrderCompleted, _ *message.Message) error {
			_, err := tx.ExecContext(ctx, "UPDATE balances SET points = points + $1 WHERE customer_id = $2", o.Points, o.CustomerID)
			return err
		}))
	if err != nil {
		log.Fatal(err)
	}
	pubsub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	poison, err := middleware.PoisonQueueWithFilter(pubsub, "orders.poison", adapter.IsPoison)
	if err != nil {
		log.Fatal(err)
	}
	retry := middleware.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond, ResetContextOnRetry: true}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(poison, retry.Middleware, middleware.Timeout(10*time.Second))
	router.AddConsumerHandler("loyalty", "orders", pubsub, credit)
	log.Println(router.Run(ctx))
}

// Decode hands the Handler the decoded payload; a payload it cannot decode
// is poison, for the router's PoisonQueue.
func ExampleDecode() {
	h := idwm.Decode(idwm.JSON[OrderCompleted], func(_ context.Context, _ *sql.Tx, o OrderCompleted, msg *message.Message) error {
		fmt.Printf("%s: %d points for customer %d\n", msg.UUID, o.Points, o.CustomerID)
		return nil
	})
	// NewHandler calls h in the claim's transaction; here, with none.
	ctx := context.Background()
	_ = h(ctx, nil, message.NewMessage("order-completed:9912", []byte(`{"order_id": 9912, "customer_id": 7, "points": 50}`)))
	err := h(ctx, nil, message.NewMessage("order-completed:9913", []byte(`points: 50`)))
	fmt.Println(adapter.IsPoison(err), errors.Is(err, adapter.ErrUndecodable))
	// Output:
	// order-completed:9912: 50 points for customer 7
	// true true
}

// Keys other than the UUID: a metadata field, a field of the payload, and a
// prefix that keeps two message types apart.
func ExampleBodyField() {
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order": {"id": 9912}}`))
	msg.Metadata.Set("order_id", "9912")
	for _, k := range []idwm.KeyFunc{
		idwm.Header("order_id"),
		idwm.BodyField("order", "id"),
		idwm.Prefixed("order-completed:", idwm.BodyField("order", "id")),
	} {
		key, err := k(msg)
		fmt.Println(key, err)
	}
	_, err := idwm.Header("missing")(msg)
	fmt.Println(errors.Is(err, adapter.ErrNoKey))
	// Output:
	// 9912 <nil>
	// 9912 <nil>
	// order-completed:9912 <nil>
	// true
}

// The events a handler produces go out through the outbox, written in the
// claim's transaction and relayed with a stable identity and the event
// time.
func ExampleOutbox() {
	ctx := context.Background()
	var db *sql.DB                // opened as above
	var mw *idempotent.Middleware // as above
	var pub message.Publisher     // any Watermill publisher
	ob, err := outbox.New(db, mw.Config().Consumer)
	if err != nil {
		log.Fatal(err)
	}
	awards, err := idwm.NewOutbox(ob, "points_awarded")
	if err != nil {
		log.Fatal(err)
	}
	credit, err := idwm.NewHandler(mw, func(ctx context.Context, tx *sql.Tx, msg *message.Message) error {
		// … the effect through tx, then the event it produces:
		award := message.NewMessage(watermill.NewUUID(), msg.Payload)
		return awards.Publish(ctx, tx, msg, award)
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = credit // router.AddConsumerHandler("loyalty", "orders", sub, credit)
	relay, err := outbox.NewRelay(ob, outbox.WithSender("points_awarded", idwm.NewSender(pub, "points")))
	if err != nil {
		log.Fatal(err)
	}
	log.Println(relay.Run(ctx))
}

// An adapter.Counter as the Observer counts what the handler did; its Next
// passes each event on.
func ExampleWithObserver() {
	var mw *idempotent.Middleware // as in the NewHandler example
	var h idwm.Handler
	counts := &adapter.Counter{Next: adapter.ObserverFunc(func(_ context.Context, e adapter.Event) {
		if e.Type == adapter.EventDeadLettered {
			log.Printf("%s: %s poison: %v", e.Source, e.Message.Key, e.Err)
		}
	})}
	handler, err := idwm.NewHandler(mw, h, idwm.WithObserver(counts))
	if err != nil {
		log.Fatal(err)
	}
	_ = handler
	st := counts.Stats()
	log.Printf("applied %d, duplicates %d, requeued %d, poison %d", st.Applied, st.Duplicates, st.Requeued, st.DeadLettered)
}

// A handler for tenants that each have a database of their own: each
// message is claimed and applied in the database of the tenant its
// metadata names.
func ExampleWithTenant() {
	dsns := map[string]string{"acme": "postgres://localhost/acme", "globex": "postgres://localhost/globex"}
	ts, err := idempotent.NewTenants(postgres.New(), "loyalty", idempotent.TenantsConfig{
		Open: func(_ context.Context, tenant string) (*sql.DB, error) {
			dsn, ok := dsns[tenant]
			if !ok {
				return nil, adapter.Poison(fmt.Errorf("no tenant %q", tenant))
			}
			return sql.Open("postgres", dsn)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer ts.Close()
	handler, err := idwm.NewHandler(nil, func(ctx context.Context, tx *sql.Tx, msg *message.Message) error {
		return nil // the tenant's effect, through tx
	}, idwm.WithTenant(ts, func(msg *message.Message) (string, error) {
		if tenant := msg.Metadata.Get("tenant"); tenant != "" {
			return tenant, nil
		}
		return "", errors.New("no tenant metadata")
	}))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(handler != nil)
	// Output: true
}
