package watermill_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/txclaim/idempotent/internal/testenv"
	idwm "github.com/txclaim/idempotent/watermill"
)

// TestDocumentedRouterOrderAppliesOnce runs the router order the package
// documentation gives — PoisonQueue, Retry, Throttle, Timeout, then this
// middleware around the handler — with a handler that fails half-way
// through (balance credited, ledger row not written) on its first attempt:
// Retry's second attempt is a new claim, the first one's partial credit
// rolled back, so the effect is applied exactly once and nothing is
// poisoned.
func TestDocumentedRouterOrderAppliesOnce(t *testing.T) {
	t.Parallel()
	l := newLedger(t, testenv.OpenPostgres(t, 4), "loyalty")
	pubsub := newGoChannel(t)
	poisonQ, err := middleware.PoisonQueueWithFilter(pubsub, "orders.poison", idwm.IsPoison)
	if err != nil {
		t.Fatal(err)
	}
	retry := middleware.Retry{MaxRetries: 3, InitialInterval: time.Millisecond, ResetContextOnRetry: true}
	throttle := middleware.NewThrottle(1000, time.Second)
	r := newRouter(t)
	var s settled
	v := newVerdicts()
	h := r.AddNoPublisherHandler("loyalty", "orders", pubsub, l.handler(func(order) bool { return true }))
	h.AddMiddleware(s.middleware, poisonQ, retry.Middleware, throttle.Middleware, middleware.Timeout(10*time.Second), v.middleware, ours(t, l))
	runRouter(t, r)
	o := order{OrderID: 4242, CustomerID: 3, Points: 50}
	if err := pubsub.Publish("orders", orderMessage(t, o)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the ack", func() (bool, error) { return s.acked.Load() == 1, nil })
	_, _, requeued := v.of(o.Key())
	if p, _, _ := v.of(o.Key()); p != 0 || !requeued || s.nacked.Load() != 0 {
		t.Fatalf("poisoned %d, first attempt requeued %v, nacks %d: want 0, true, 0 (Retry outside takes the requeue)", p, requeued, s.nacked.Load())
	}
	l.audit(t, []order{o})
}
