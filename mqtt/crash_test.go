package mqtt_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/mqtt"
)

// A consumer whose transaction committed but whose PUBACK (QoS 1) or PUBREC
// (QoS 2) never reached the broker — its connection went silent inside the
// handler, and it was killed after the commit — gets the message again
// when its session is resumed: the claim finds it, a Duplicate, one effect.
func TestKilledAfterCommitBeforeAck(t *testing.T) {
	for _, qos := range []byte{1, 2} {
		t.Run(fmt.Sprintf("QoS%d", qos), func(t *testing.T) {
			t.Parallel()
			addr := brokerAddr(t)
			l := newLedger(t)
			rec := testenv.NewRecorder()
			topic := "idempotent/" + testenv.UniqueName("crash")
			clientID := testenv.UniqueName("crash")
			openSession(t, addr, clientID, topic, qos)
			pub := connect(t, addr, testenv.UniqueName("pub"), 0)
			o := order{OrderID: 5, CustomerID: 2, Points: 17}
			var first atomic.Pointer[proc]
			credit := l.handler()
			c, err := mqtt.NewConsumer(l.mw, func(ctx context.Context, tx *sql.Tx, m *paho.Publish) error {
				if p := first.Load(); p != nil {
					p.mute() // from now on the first process's acknowledgements go nowhere
				}
				return credit(ctx, tx, m)
			}, mqtt.WithObserver(rec))
			if err != nil {
				t.Fatal(err)
			}
			sendOrder(t, pub, topic, qos, o)
			p := newProc(c, addr)
			first.Store(p)
			p.start(clientID, topic, qos)
			rec.Until(t, 30*time.Second, "applied", func() bool { return rec.Count(adapter.EventApplied, o.Key()) == 1 })
			p.kill()
			<-p.done
			first.Store(nil)

			second := startProc(c, addr, clientID, topic, qos)
			rec.Until(t, 30*time.Second, "delivered again on the resumed session, a Duplicate", func() bool {
				return rec.Count(adapter.EventDuplicate, o.Key()) == 1
			})
			second.stop(t)
			if n := rec.Count(adapter.EventApplied, o.Key()); n != 1 {
				t.Errorf("%d Applied, want 1", n)
			}
			testenv.AuditOrders(t, l.db, l.schema, []order{o})
		})
	}
}
