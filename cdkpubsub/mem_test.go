package cdkpubsub_test

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gocloud.dev/gcerrors"
	"gocloud.dev/pubsub"
	"gocloud.dev/pubsub/driver"
	"gocloud.dev/pubsub/mempubsub"

	"github.com/txclaim/idempotent/cdkpubsub"
)

// memBroker is a mempubsub topic with one subscription on it, standing for
// a service's subscription: every consumer process (a memProc) receives
// from it through a *pubsub.Subscription of its own, so that shutting one
// process's Subscription down without acking — a crash — leaves its
// messages to the broker, which delivers them again to the next process
// once their ack deadline has passed.
type memBroker struct {
	topic *pubsub.Topic
	sub   *pubsub.Subscription
	// sent counts the messages sent; acked holds the ids of those whose
	// ack reached the broker's subscription (a copy delivered again after
	// its ack deadline may be acked twice).
	sent  atomic.Int64
	acked sync.Map
}

// newMemBroker returns a broker whose messages come again ackDeadline after
// a delivery that was neither acked nor nacked; it is shut down in Cleanup.
func newMemBroker(t testing.TB, ackDeadline time.Duration) *memBroker {
	t.Helper()
	b := &memBroker{topic: mempubsub.NewTopic()}
	b.sub = mempubsub.NewSubscription(b.topic, ackDeadline)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = b.sub.Shutdown(ctx)
		_ = b.topic.Shutdown(ctx)
	})
	return b
}

// send publishes body with the key in DefaultKeyMetadata and md besides.
func (b *memBroker) send(ctx context.Context, key string, md map[string]string, body []byte) error {
	m := map[string]string{cdkpubsub.DefaultKeyMetadata: key}
	maps.Copy(m, md)
	if err := b.topic.Send(ctx, &pubsub.Message{Body: body, Metadata: m}); err != nil {
		return err
	}
	b.sent.Add(1)
	return nil
}

// memProc is the driver of one consumer process's Subscription: it takes
// messages from the broker's subscription and passes its acks and nacks on
// to them, until it is killed, after which they go nowhere.
type memProc struct {
	b *memBroker
	// lose, when set, is asked of each ack; when it returns true the ack
	// is turned into a nack, so the message comes again at once, as after
	// a crash between the commit and the ack.
	lose func(key string) bool
	// crashAt, when set, is asked of each ack before it is passed on;
	// when it returns true the process dies there: that ack and every
	// later one go nowhere.
	crashAt func(key string) bool
	// onReceive, when set, is told of each message the process takes.
	onReceive func(key string)
	// noNack makes the driver one that cannot Nack (Message.Nackable is
	// false), as drivers of at-most-once services are.
	noNack bool

	mu     sync.Mutex
	held   map[int]*pubsub.Message
	next   int
	killed bool
}

// subscription returns a new process's Subscription on b.
func (b *memBroker) subscription(lose func(key string) bool) (*pubsub.Subscription, *memProc) {
	return b.process(&memProc{lose: lose})
}

// process returns p's Subscription on b; p's hooks are set.
func (b *memBroker) process(p *memProc) (*pubsub.Subscription, *memProc) {
	p.b, p.held = b, map[int]*pubsub.Message{}
	return pubsub.NewSubscription(p, nil, nil), p
}

// kill makes p drop every ack and nack from now on.
func (p *memProc) kill() {
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
}

func (p *memProc) ReceiveBatch(ctx context.Context, maxMessages int) ([]*driver.Message, error) {
	var out []*driver.Message
	wait := 50 * time.Millisecond
	for len(out) < maxMessages {
		rctx, cancel := context.WithTimeout(ctx, wait)
		m, err := p.b.sub.Receive(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			if rctx.Err() != nil {
				return out, nil // nothing more for now
			}
			return out, err
		}
		if p.onReceive != nil {
			p.onReceive(m.Metadata[cdkpubsub.DefaultKeyMetadata])
		}
		p.mu.Lock()
		id := p.next
		p.next++
		p.held[id] = m
		p.mu.Unlock()
		out = append(out, &driver.Message{LoggableID: m.LoggableID, Body: m.Body, Metadata: maps.Clone(m.Metadata),
			AckID: id, AsFunc: func(any) bool { return false }})
		wait = time.Millisecond
	}
	return out, nil
}

func (p *memProc) settle(ids []driver.AckID, ack bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		m := p.held[id.(int)]
		delete(p.held, id.(int))
		if m == nil {
			continue
		}
		if ack && !p.killed && p.crashAt != nil && p.crashAt(m.Metadata[cdkpubsub.DefaultKeyMetadata]) {
			p.killed = true
		}
		if p.killed {
			continue
		}
		if ack && (p.lose == nil || !p.lose(m.Metadata[cdkpubsub.DefaultKeyMetadata])) {
			m.Ack()
			p.b.acked.Store(m.LoggableID, true)
		} else {
			m.Nack()
		}
	}
}

func (p *memProc) SendAcks(_ context.Context, ids []driver.AckID) error {
	p.settle(ids, true)
	return nil
}

func (p *memProc) SendNacks(_ context.Context, ids []driver.AckID) error {
	p.settle(ids, false)
	return nil
}

func (p *memProc) CanNack() bool                    { return !p.noNack }
func (*memProc) IsRetryable(error) bool             { return false }
func (*memProc) As(any) bool                        { return false }
func (*memProc) ErrorAs(error, any) bool            { return false }
func (*memProc) ErrorCode(error) gcerrors.ErrorCode { return gcerrors.Unknown }
func (*memProc) Close() error                       { return nil }

// dead reports whether p was killed.
func (p *memProc) dead() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.killed
}
