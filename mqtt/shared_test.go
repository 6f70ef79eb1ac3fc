package mqtt_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/mqtt"
)

// A shared subscription spreads one topic over three consumers of a group,
// each on a persistent session of its own. 600 orders, 30% of them
// published twice, while two of the consumers are killed mid-stream and
// restarted on their sessions: every order is applied exactly once, the
// balances are exact.
func TestSharedSubscriptionWithKills(t *testing.T) {
	t.Parallel()
	addr := brokerAddr(t)
	l := newLedger(t)
	rec := testenv.NewRecorder()
	topic := "idempotent/" + testenv.UniqueName("shared")
	filter := "$share/loyalty/" + topic
	const qos = 1
	ids := make([]string, 3)
	for i := range ids {
		ids[i] = testenv.UniqueName(fmt.Sprintf("member%d", i))
		openSession(t, addr, ids[i], filter, qos)
	}
	c, err := mqtt.NewConsumer(l.mw, l.handler(), mqtt.WithObserver(rec), mqtt.WithWorkers(2),
		mqtt.WithRetryDelay(10*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	procs := make([]*proc, len(ids))
	for i, id := range ids {
		procs[i] = startProc(c, addr, id, filter, qos)
	}
	pub := connect(t, addr, testenv.UniqueName("pub"), 0)
	orders := testenv.MakeOrders(600)
	sends := 0
	for i, o := range orders {
		sendOrder(t, pub, topic, qos, o)
		sends++
		if o.OrderID%10 < 3 {
			sendOrder(t, pub, topic, qos, o) // a producer's re-send
			sends++
		}
		if i == 200 || i == 400 { // kill a member and restart it on its session
			k := i / 200
			rec.Until(t, 60*time.Second, "applied some", func() bool { return rec.Sum(adapter.EventApplied) >= i/2 })
			procs[k].kill()
			<-procs[k].done
			procs[k] = startProc(c, addr, ids[k], filter, qos)
		}
	}
	rec.Until(t, 120*time.Second, "applied every order", func() bool { return rec.Sum(adapter.EventApplied) >= len(orders) })
	for _, p := range procs {
		p.stop(t)
	}
	if n := rec.Sum(adapter.EventApplied); n != len(orders) {
		t.Errorf("%d Applied, want %d", n, len(orders))
	}
	if n := rec.Sum(adapter.EventDeadLettered); n != 0 {
		t.Errorf("%d dead-lettered, want 0", n)
	}
	s := c.Stats()
	t.Logf("%d sends of %d orders over 3 members, 2 kills: applied %d, duplicates %d, requeued %d, released %d",
		sends, len(orders), s.Applied, s.Duplicates, s.Requeued, s.Released)
	testenv.AuditOrders(t, l.db, l.schema, orders)
}
