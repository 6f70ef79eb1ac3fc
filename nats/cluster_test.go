package nats_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	idnats "github.com/txclaim/idempotent/nats"
)

// outMsg is one message to publish.
type outMsg struct {
	msgID string
	hdr   map[string]string
	data  []byte
}

// publishAll publishes msgs in order, retrying each until the stream
// acknowledges it: its Nats-Msg-Id makes a retry after a lost PubAck safe.
// It returns how many PubAcks reported a duplicate.
func publishAll(ctx context.Context, js jetstream.JetStream, subject string, msgs []outMsg, published *atomic.Int64) (dups int, err error) {
	for _, o := range msgs {
		m := natsgo.NewMsg(subject)
		m.Data = o.data
		m.Header.Set(jetstream.MsgIDHeader, o.msgID)
		for k, v := range o.hdr {
			m.Header.Set(k, v)
		}
		for {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			ack, err := js.PublishMsg(pctx, m)
			cancel()
			if err == nil {
				if ack.Duplicate {
					dups++
				}
				if published != nil {
					published.Add(1)
				}
				break
			}
			if ctx.Err() != nil {
				return dups, fmt.Errorf("publish %s: %w", o.msgID, err)
			}
		}
	}
	return dups, nil
}

// TestClusterAuditWithDuplicatesAndConsumerKills runs 5,000 orders, 1,000 of
// them published twice (a producer republishing after the stream's
// duplicate window, so the stream stores both), through an R3 stream on a
// three-node cluster, while consumer processes are killed mid-stream three
// times. Every effect lands exactly once.
func TestClusterAuditWithDuplicatesAndConsumerKills(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node cluster")
	}
	c := startCluster(t, 3)
	nc := connect(t, c.urls())
	js := newJS(t, nc)
	s, stream := newStream(t, js, 3)
	durable := "loyalty"
	cons := newConsumer(t, s, durable, 2*time.Second)
	l := newLedger(t, testenv.OpenPostgres(t, 12), durable)

	orders := testenv.MakeOrders(5000)
	var msgs []outMsg
	for i, o := range orders {
		msgs = append(msgs, outMsg{msgID: fmt.Sprintf("pub-%d", i), hdr: map[string]string{"Order-Key": o.Key()}, data: mustJSON(t, o)})
		if i%5 == 0 && i >= 500 { // the republish of an order 500 back
			r := orders[i-500]
			msgs = append(msgs, outMsg{msgID: fmt.Sprintf("repub-%d", i), hdr: map[string]string{"Order-Key": r.Key()}, data: mustJSON(t, r)})
		}
	}
	for i := 0; i < 500; i += 5 {
		msgs = append(msgs, outMsg{msgID: fmt.Sprintf("repub-tail-%d", i), hdr: map[string]string{"Order-Key": orders[i].Key()}, data: mustJSON(t, orders[i])})
	}
	if len(msgs) != 6000 {
		t.Fatalf("%d messages, want 6000", len(msgs))
	}
	pubDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		_, err := publishAll(ctx, js, stream+".orders", msgs, nil)
		pubDone <- err
	}()

	var all []*idnats.Consumer
	newProcess := func(server int) *running {
		cn := must(t)(idnats.NewConsumer(l.mw, l.handler(), idnats.WithKey(idnats.Header("Order-Key")), idnats.WithWorkers(3), idnats.WithFetchWait(100*time.Millisecond)))
		all = append(all, cn)
		return start(t, cn, c.servers[server%3].url(), stream, durable)
	}
	procs := []*running{newProcess(0), newProcess(1)}
	for kill := 1; kill <= 3; kill++ {
		waitFor(t, 2*time.Minute, fmt.Sprintf("%d ledger rows", kill*1200), func() (bool, error) {
			return l.count(t, "SELECT count(*) FROM $S.point_ledger") >= int64(kill*1200), nil
		})
		victim := procs[kill%2]
		if err := victim.kill(); !errors.Is(err, idnats.ErrConnectionClosed) {
			t.Fatalf("kill %d: Run returned %v, want ErrConnectionClosed", kill, err)
		}
		procs[kill%2] = newProcess(kill + 1)
	}
	if err := <-pubDone; err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Minute, "every message acked", func() (bool, error) {
		np, ap, err := pending(t, cons)
		return err == nil && np == 0 && ap == 0, nil
	})
	for _, p := range procs {
		if err := p.stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	var applied, dups, settleFailed, delivered int64
	for _, cn := range all {
		s := cn.Stats()
		applied += s.Applied
		dups += s.Duplicates
		settleFailed += s.SettleFailed
		delivered += settledAll(s)
	}
	t.Logf("6000 messages (5000 orders, 1000 republished), 3 consumer kills: %d deliveries, %d applied, %d duplicates, %d acks lost to the kills",
		delivered, applied, dups, settleFailed)
	if applied != int64(len(orders)) || dups < 1000 {
		t.Errorf("applied %d, duplicates %d: want %d applied and at least 1000 duplicates", applied, dups, len(orders))
	}
	l.audit(t, orders)
}

// TestClusterStreamLeaderKilledMidStream SIGKILLs the stream's leader while
// 3,000 orders are being published and consumed; the cluster elects another
// leader, the publisher retries with the same Nats-Msg-Id, the consumer
// carries on, and every order is applied exactly once.
func TestClusterStreamLeaderKilledMidStream(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node cluster")
	}
	c := startCluster(t, 3)
	nc := connect(t, c.urls())
	js := newJS(t, nc)
	s, stream := newStream(t, js, 3)
	durable := "loyalty"
	cons := newConsumer(t, s, durable, 2*time.Second)
	l := newLedger(t, testenv.OpenPostgres(t, 6), durable)

	orders := testenv.MakeOrders(3000)
	var msgs []outMsg
	for _, o := range orders {
		msgs = append(msgs, outMsg{msgID: o.Key(), data: mustJSON(t, o)})
	}
	pubDone := make(chan error, 1)
	var published atomic.Int64
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		_, err := publishAll(ctx, js, stream+".orders", msgs, &published)
		pubDone <- err
	}()

	cn := must(t)(idnats.NewConsumer(l.mw, l.handler(), idnats.WithWorkers(4), idnats.WithFetchWait(100*time.Millisecond),
		idnats.WithObserver(adapter.ObserverFunc(func(_ context.Context, ev adapter.Event) {
			if ev.Type == adapter.EventFetchError {
				t.Logf("pull retried: %v", ev.Err)
			}
		}))))
	p := start(t, cn, c.urls(), stream, durable)

	// Kill mid-stream: half the messages published, some consumed.
	waitFor(t, 2*time.Minute, "1500 messages published and some consumed", func() (bool, error) {
		return published.Load() >= 1500 && l.count(t, "SELECT count(*) FROM $S.point_ledger") > 0, nil
	})
	leader := streamLeader(t, js, stream)
	c.byName(leader).kill()
	t.Logf("killed the stream leader %s with SIGKILL at %d ledger rows, %d of %d messages published", leader, l.count(t, "SELECT count(*) FROM $S.point_ledger"), published.Load(), len(msgs))
	var next string
	waitFor(t, time.Minute, "a new leader", func() (bool, error) {
		next = streamLeader(t, js, stream)
		return next != leader, nil
	})

	if err := <-pubDone; err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Minute, "every message acked", func() (bool, error) {
		select {
		case err := <-p.done:
			return false, fmt.Errorf("Run returned early: %w", err)
		default:
		}
		np, ap, err := pending(t, cons)
		return err == nil && np == 0 && ap == 0, nil
	})
	if err := p.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st := cn.Stats()
	t.Logf("new leader %s; stream holds %d messages; consumer: %d deliveries, %d applied, %d duplicates, %d settle failures, %d failed pulls retried",
		next, info.State.Msgs, settledAll(st), st.Applied, st.Duplicates, st.SettleFailed, st.FetchErrors)
	if info.State.Msgs != uint64(len(orders)) {
		t.Errorf("the stream holds %d messages, want %d: a publish was lost or stored twice", info.State.Msgs, len(orders))
	}
	if st.Applied != int64(len(orders)) {
		t.Errorf("applied %d, want %d", st.Applied, len(orders))
	}
	l.audit(t, orders)
}
