package cdkpubsub_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"gocloud.dev/pubsub"

	"github.com/txclaim/idempotent/brokertest"
	"github.com/txclaim/idempotent/cdkpubsub"
)

// TestBrokertest runs the adapters' conformance suite on mempubsub, per
// message and in batches: a topic and subscription of each scenario's own,
// with a one-second ack deadline, so that what a killed consumer did not
// ack comes back soon.
func TestBrokertest(t *testing.T) {
	brokertest.Run(t, memHarness{ackDeadline: time.Second})
}

type memHarness struct{ ackDeadline time.Duration }

// Features: the consumer routes deliveries by ordering key, but a Go CDK
// Subscription keeps no topic order (mempubsub hands out what it holds in
// any order), so messages published in order may still park: no
// RoutesByOrderKey.
func (memHarness) Features() brokertest.Features {
	return brokertest.Features{Batch: true, LoseAck: true, Kill: true, Restart: true, Ordered: true}
}

func (h memHarness) Open(t *testing.T) brokertest.Transport {
	return &memTransport{b: newMemBroker(t, h.ackDeadline)}
}

type memTransport struct{ b *memBroker }

// Publish sends m keyed by DefaultKeyMetadata, the adapter's default key.
func (tr *memTransport) Publish(ctx context.Context, m brokertest.Message) error {
	return tr.b.send(ctx, m.Key, m.Headers, m.Body)
}

// NewConsumer builds the adapter's consumer of cfg's mode with the default
// key and event time, and short retry delays.
func (tr *memTransport) NewConsumer(cfg brokertest.ConsumerConfig) (brokertest.Consumer, error) {
	c := &memConsumer{b: tr.b, lose: cfg.LoseAck}
	var err error
	c.c, err = newSuiteConsumer(cfg)
	return c, err
}

// newSuiteConsumer builds the adapter's consumer of cfg's mode with the
// default key and event time, and short retry delays: what every harness
// of this package gives the suite.
func newSuiteConsumer(cfg brokertest.ConsumerConfig) (*cdkpubsub.Consumer, error) {
	opts := []cdkpubsub.Option{cdkpubsub.WithWorkers(cfg.Workers), cdkpubsub.WithObserver(cfg.Observer),
		cdkpubsub.WithRetryDelay(10*time.Millisecond, 50*time.Millisecond)}
	if cfg.NoEventTime {
		opts = append(opts, cdkpubsub.WithoutEventTime())
	}
	if cfg.Batch {
		return cdkpubsub.NewBatchConsumer(cfg.Middleware, func(ctx context.Context, tx *sql.Tx, msgs []*pubsub.Message) error {
			bodies := make([][]byte, len(msgs))
			for i, m := range msgs {
				bodies[i] = m.Body
			}
			return cfg.BatchHandler(ctx, tx, bodies)
		}, append(opts, cdkpubsub.WithBatchSize(cfg.BatchSize))...)
	}
	return cdkpubsub.NewConsumer(cfg.Middleware, func(ctx context.Context, tx *sql.Tx, m *pubsub.Message) error {
		return cfg.Handler(ctx, tx, m.Body)
	}, opts...)
}

// memConsumer is a consumer process: a Subscription of its own and a Run.
type memConsumer struct {
	subRun
	b    *memBroker
	lose func(key string) bool
	proc *memProc
}

func (c *memConsumer) Start(context.Context) error {
	sub, proc := c.b.subscription(c.lose)
	c.mu.Lock()
	c.proc = proc
	c.mu.Unlock()
	c.start(sub)
	return nil
}

// subRun is what the mempubsub and gcppubsub harnesses' consumer processes
// share: a Subscription of their own and the Consumer's Run on it.
type subRun struct {
	c *cdkpubsub.Consumer

	mu     sync.Mutex
	sub    *pubsub.Subscription
	run    brokertest.Background
	killed bool
}

// start runs the Consumer on sub.
func (c *subRun) start(sub *pubsub.Subscription) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sub = sub
	c.run.Go(func(ctx context.Context) error { return c.c.Run(ctx, sub) })
}

// Stop ends Run gracefully, then shuts the Subscription down, which sends
// the acks still queued.
func (c *subRun) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	stopped, err := c.run.Stop(ctx)
	if !stopped || ctx.Err() != nil {
		return err // nothing ran, or it did not end in time
	}
	if c.killed {
		return nil
	}
	if serr := c.sub.Shutdown(ctx); serr != nil && !errors.Is(serr, context.Canceled) {
		err = errors.Join(err, serr)
	}
	return err
}

// crash shuts the Subscription down at once, as a crash does, and cancels
// the Run without waiting for its handlers: from then on the process's
// acks go nowhere, and the service delivers again what it had not acked
// when its ack deadline (visibility timeout) passes.
func (c *subRun) crash() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.killed = true
	c.run.Cancel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.sub.Shutdown(ctx)
	return nil
}

// Kill crashes the process: its acks and nacks go nowhere from now on, and
// its Subscription is shut down without waiting for the handlers, whose
// messages the broker delivers again after the ack deadline.
func (c *memConsumer) Kill() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.killed = true
	c.proc.kill()
	go func() { _ = c.sub.Shutdown(context.Background()) }()
	return nil
}

// Unsettled counts the messages sent whose ack has not reached the
// broker's subscription.
func (tr *memTransport) Unsettled(context.Context) (int, error) {
	acked := 0
	tr.b.acked.Range(func(any, any) bool { acked++; return true })
	return int(tr.b.sent.Load()) - acked, nil
}

// DeadLetters returns nil: poison is terminated (acked and reported).
func (tr *memTransport) DeadLetters(context.Context) ([]string, error) { return nil, nil }
