package watermill_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/lib/pq"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	idwm "github.com/txclaim/idempotent/watermill"
)

// halfway is the effect of TestRouterMiddlewareInAnyOrder: it credits the
// balance, then fails on the first attempt of every order (before the
// ledger row: half the effect written) and on every attempt of poisonID
// with a poison error, also after the balance.
func halfway(l *ledger, poisonID int64) idwm.Handler {
	seen := newOnce()
	return idwm.Decode(idwm.JSON[order], func(ctx context.Context, tx *sql.Tx, o order, _ *message.Message) error {
		q := pq.QuoteIdentifier(l.schema)
		if _, err := tx.ExecContext(ctx, "UPDATE "+q+".balances SET points = points + $1 WHERE customer_id = $2", o.Points, o.CustomerID); err != nil {
			return err
		}
		if o.OrderID == poisonID {
			return adapter.Poison(fmt.Errorf("order %d: customer %d is closed", o.OrderID, o.CustomerID))
		}
		if seen.first(o.OrderID) {
			return fmt.Errorf("order %d: pricing service timed out", o.OrderID)
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO "+q+".point_ledger (order_id, customer_id, points) VALUES ($1, $2, $3)", o.OrderID, o.CustomerID, o.Points)
		return err
	})
}

// poisonTopic collects what a poison queue publishes, by UUID.
type poisonTopic struct {
	mu   sync.Mutex
	msgs map[string][]*message.Message
}

func collectPoison(t *testing.T, sub message.Subscriber, topic string) *poisonTopic {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	p := &poisonTopic{msgs: map[string][]*message.Message{}}
	go func() {
		for m := range ch {
			p.mu.Lock()
			p.msgs[m.UUID] = append(p.msgs[m.UUID], m)
			p.mu.Unlock()
			m.Ack()
		}
	}()
	return p
}

func (p *poisonTopic) of(uuid string) []*message.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.msgs[uuid]
}

// TestRouterMiddlewareInAnyOrder puts middleware.Retry, a poison queue,
// middleware.Timeout and middleware.Throttle on the router in every order,
// split at every point between router and handler middleware, with the
// poison queue filtered by adapter.IsPoison and, separately, unfiltered
// (middleware.PoisonQueue: every error). The handler credits order 50's
// balance and fails before its ledger row on the first attempt; order 666
// credits its balance and fails poison on every attempt. In every order:
//
//   - order 50 is applied exactly once: 50 points, one ledger row, one
//     claim. Retry's second run is a new claim in a new transaction, the
//     first's partial credit rolled back. (Where an unfiltered poison queue
//     inside Retry takes the first failure instead, the message went to the
//     poison topic with nothing written, its claim rolled back too, so its
//     replay from the poison topic applies it, once.)
//   - order 666 reaches the poison topic exactly once, and nothing of it
//     is written: no points, no ledger row, no claim.
//
// Before NewHandler was a handler, the exactly-once step was a middleware
// that could be put outside Retry (100 points: Retry re-ran the handler in
// the claim's transaction, which kept the failed attempt's partial credit)
// or outside a poison queue (the claim and the partial credit of order 666
// committed, the message marked seen with half its effect).
func TestRouterMiddlewareInAnyOrder(t *testing.T) {
	t.Parallel()
	db := testenv.OpenPostgres(t, 12)
	names := []string{"retry", "poison", "timeout", "throttle"}
	perms := permutations(len(names))
	for _, filtered := range []bool{true, false} {
		for n, perm := range perms {
			split := n % (len(perm) + 1)
			var b strings.Builder
			for i, j := range perm {
				if i == split {
					b.WriteString("|")
				}
				b.WriteString(names[j] + ",")
			}
			if split == len(perm) {
				b.WriteString("|")
			}
			name := map[bool]string{true: "IsPoison", false: "unfiltered"}[filtered] + "/" + strings.TrimSuffix(b.String(), ",")
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				runInOrder(t, db, perm, split, filtered)
			})
		}
	}
}

// runInOrder is one router of TestRouterMiddlewareInAnyOrder: the
// middleware perm (indexes into retry, poison, timeout, throttle), the
// first split of them added to the router, the rest to the handler.
func runInOrder(t *testing.T, db *sql.DB, perm []int, split int, filtered bool) {
	l := newLedger(t, db, "loyalty")
	pubsub := newGoChannel(t)
	poisonQ, err := middleware.PoisonQueue(pubsub, "orders.poison")
	if filtered {
		poisonQ, err = middleware.PoisonQueueWithFilter(pubsub, "orders.poison", adapter.IsPoison)
	}
	if err != nil {
		t.Fatal(err)
	}
	retry := middleware.Retry{MaxRetries: 3, InitialInterval: time.Millisecond, ResetContextOnRetry: true}
	all := []message.HandlerMiddleware{
		retry.Middleware,
		poisonQ,
		middleware.Timeout(10 * time.Second),
		middleware.NewThrottle(1000, time.Second).Middleware,
	}
	var mws []message.HandlerMiddleware
	for _, i := range perm {
		mws = append(mws, all[i])
	}
	poisoned := collectPoison(t, pubsub, "orders.poison")
	var c adapter.Counter
	r := newRouter(t)
	var s settled
	r.AddMiddleware(s.middleware)
	r.AddMiddleware(mws[:split]...)
	const poisonID = 666
	h := r.AddConsumerHandler("loyalty", "orders", pubsub, ours(t, l, halfway(l, poisonID), idwm.WithObserver(&c)))
	h.AddMiddleware(mws[split:]...)
	runRouter(t, r)

	o := order{OrderID: 50, CustomerID: 5, Points: 50}
	bad := order{OrderID: poisonID, CustomerID: 6, Points: 30}
	if err := pubsub.Publish("orders", orderMessage(t, bad), orderMessage(t, o)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "order 666 on the poison topic, order 50 applied or on the poison topic", func() (bool, error) {
		return len(poisoned.of(bad.Key())) > 0 && (c.Stats().Applied > 0 || len(poisoned.of(o.Key())) > 0), nil
	})
	if p := poisoned.of(o.Key()); len(p) > 0 {
		// An unfiltered poison queue took the first failure: replay it.
		t.Logf("order 50 went to the poison topic (%s); replaying it", p[0].Metadata.Get(middleware.ReasonForPoisonedKey))
		if filtered {
			t.Errorf("a poison queue filtered by adapter.IsPoison took a requeue: %s", p[0].Metadata.Get(middleware.ReasonForPoisonedKey))
		}
		if n := l.count(t, "SELECT count(*) FROM $S.processed_messages"); n != 0 {
			t.Errorf("%d claims with order 50 on the poison topic: its claim committed without its effect", n)
		}
		if err := pubsub.Publish("orders", p[0].Copy()); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "the replay of order 50 applied", func() (bool, error) { return c.Stats().Applied > 0, nil })
	}
	if n := len(poisoned.of(bad.Key())); n != 1 {
		t.Errorf("order 666 reached the poison topic %d times, want 1", n)
	}
	st := c.Stats()
	if st.Applied != 1 || st.Duplicates != 0 || st.DeadLettered == 0 {
		t.Errorf("stats %+v: want order 50 applied once, order 666 dead-lettered", st)
	}
	if got := l.count(t, "SELECT points FROM $S.balances WHERE customer_id = 5"); got != 50 {
		t.Errorf("order 50: %d points, want 50", got)
	}
	l.audit(t, []order{o})
}

// permutations returns every order of 0 … n-1.
func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := append(append(append([]int{}, p[:i]...), n-1), p[i:]...)
			out = append(out, q)
		}
	}
	return out
}
