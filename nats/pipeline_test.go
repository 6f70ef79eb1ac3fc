package nats_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txclaim/idempotent/internal/testenv"
	idnats "github.com/txclaim/idempotent/nats"
)

// fakeMsg is a delivery of a fake consumer: a key, and a DoubleAck that
// calls ack.
type fakeMsg struct {
	jetstream.Msg // nil: only the methods below are called
	seq           uint64
	ack           func(seq uint64) error
}

func (m *fakeMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{NumDelivered: 1, Sequence: jetstream.SequencePair{Stream: m.seq, Consumer: m.seq}}, nil
}
func (m *fakeMsg) Data() []byte { return nil }
func (m *fakeMsg) Headers() natsgo.Header {
	return natsgo.Header{natsgo.MsgIdHdr: []string{fmt.Sprintf("fake-%d", m.seq)}}
}
func (m *fakeMsg) DoubleAck(context.Context) error { return m.ack(m.seq) }
func (m *fakeMsg) InProgress() error               { return nil }
func (m *fakeMsg) Nak() error                      { return nil }

// fakeBatch is a fetch's answer: msgs, then the channel closes.
type fakeBatch struct{ msgs chan jetstream.Msg }

func (b fakeBatch) Messages() <-chan jetstream.Msg { return b.msgs }
func (b fakeBatch) Error() error                   { return nil }

// fakeConsumer answers the first fetch with msgs and every later one with
// nothing once idle is closed.
type fakeConsumer struct {
	jetstream.Consumer // nil: only the methods below are called
	mu                 sync.Mutex
	msgs               []jetstream.Msg
	idle               chan struct{}
}

func (c *fakeConsumer) CachedInfo() *jetstream.ConsumerInfo {
	return &jetstream.ConsumerInfo{Name: "fake", Stream: "FAKE",
		Config: jetstream.ConsumerConfig{Durable: "fake", AckPolicy: jetstream.AckExplicitPolicy}}
}

func (c *fakeConsumer) Info(context.Context) (*jetstream.ConsumerInfo, error) {
	return c.CachedInfo(), nil
}

func (c *fakeConsumer) Fetch(int, ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	c.mu.Lock()
	msgs := c.msgs
	c.msgs = nil
	c.mu.Unlock()
	b := fakeBatch{msgs: make(chan jetstream.Msg, len(msgs))}
	for _, m := range msgs {
		b.msgs <- m
	}
	if len(msgs) > 0 {
		close(b.msgs)
		return b, nil
	}
	go func() { <-c.idle; close(b.msgs) }()
	return b, nil
}

// TestWorkerTakesNextMessageWhileAckIsConfirmed runs one worker on two
// messages whose first DoubleAck is confirmed only once the second
// message's handler has run: the worker must not wait for a confirmation
// before it takes the next message, yet must settle its messages one at a
// time, in order.
func TestWorkerTakesNextMessageWhileAckIsConfirmed(t *testing.T) {
	db := testenv.OpenPostgres(t, 4)
	l := newLedger(t, db, "pipeline")
	secondHandled := make(chan struct{})
	var mu sync.Mutex
	var acked []uint64
	inFlight, most := 0, 0
	secondAcking := make(chan struct{})
	ack := func(seq uint64) error {
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		if seq == 2 {
			close(secondAcking)
		}
		if seq == 1 {
			select {
			case <-secondHandled:
			case <-time.After(time.Minute):
				t.Error("the worker waited for the first message's ack confirmation before taking the second message")
			}
			// The second message's settle must wait for this one: give a
			// settle that does not wait the time to start, so that it is
			// seen in flight beside this one (most == 2).
			select {
			case <-secondAcking:
			case <-time.After(200 * time.Millisecond):
			}
		}
		mu.Lock()
		inFlight--
		acked = append(acked, seq)
		mu.Unlock()
		return nil
	}
	cons := &fakeConsumer{idle: make(chan struct{}), msgs: []jetstream.Msg{&fakeMsg{seq: 1, ack: ack}, &fakeMsg{seq: 2, ack: ack}}}
	c := must(t)(idnats.NewConsumer(l.mw, func(ctx context.Context, tx *sql.Tx, m jetstream.Msg) error {
		if md, _ := m.Metadata(); md.Sequence.Stream == 2 {
			close(secondHandled)
		}
		return nil
	}, idnats.WithWorkers(1), idnats.WithoutEventTime()))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, cons) }()
	waitFor(t, time.Minute, "both messages applied", func() (bool, error) { return c.Stats().Applied == 2, nil })
	cancel()
	close(cons.idle)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if most != 1 || len(acked) != 2 || acked[0] != 1 || acked[1] != 2 {
		t.Errorf("acks confirmed in order %v with up to %d in flight, want 1 then 2, one at a time", acked, most)
	}
}
