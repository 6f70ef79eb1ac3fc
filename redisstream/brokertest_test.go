package redisstream_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/txclaim/idempotent/brokertest"
	"github.com/txclaim/idempotent/redisstream"
)

// TestBrokertest runs the adapters' conformance suite on Redis Streams: a
// stream and a consumer group of each scenario's own on the local Redis,
// per message and in batches.
func TestBrokertest(t *testing.T) {
	brokertest.Run(t, redisHarness{addr: redisAddr()})
}

type redisHarness struct{ addr string }

func (redisHarness) Features() brokertest.Features {
	return brokertest.Features{Batch: true, LoseAck: true, Kill: true, Restart: true, RequeueDelay: true, RoutesByOrderKey: true}
}

// harnessGroup is the consumer group every scenario's consumers join.
const harnessGroup = "brokertest"

// harnessClaimIdle is the claim idle bound of the harness's consumers:
// what a killed or stopped consumer left pending is re-claimed that soon.
const harnessClaimIdle = 300 * time.Millisecond

// Open creates a stream and its group; Redis assigns each entry's id.
func (h redisHarness) Open(t *testing.T) brokertest.Transport {
	rdb := newClient(t, h.addr)
	return &redisTransport{t: t, addr: h.addr, rdb: rdb, stream: newStream(t, rdb, harnessGroup)}
}

type redisTransport struct {
	t      *testing.T
	addr   string
	rdb    *redis.Client
	stream string
	keys   sync.Map // entry id → key, for LoseAck
}

// Publish adds m with its key in DefaultKeyField, its headers as fields
// and its body in PayloadField.
func (tr *redisTransport) Publish(ctx context.Context, m brokertest.Message) error {
	vals := []any{redisstream.DefaultKeyField, m.Key, redisstream.PayloadField, string(m.Body)}
	for k, v := range m.Headers {
		vals = append(vals, k, v)
	}
	id, err := tr.rdb.XAdd(ctx, &redis.XAddArgs{Stream: tr.stream, Values: vals}).Result()
	if err == nil {
		tr.keys.Store(id, m.Key)
	}
	return err
}

// NewConsumer builds the adapter's consumer of cfg's mode, with the
// default key and event time.
func (tr *redisTransport) NewConsumer(cfg brokertest.ConsumerConfig) (brokertest.Consumer, error) {
	opts := []redisstream.Option{redisstream.WithWorkers(cfg.Workers), redisstream.WithObserver(cfg.Observer),
		redisstream.WithBlock(50 * time.Millisecond), redisstream.WithClaimIdle(harnessClaimIdle),
		redisstream.WithRetryDelay(10*time.Millisecond, 50*time.Millisecond)}
	if cfg.NoEventTime {
		opts = append(opts, redisstream.WithoutEventTime())
	}
	c := &redisConsumer{tr: tr, lose: cfg.LoseAck}
	var err error
	if cfg.Batch {
		c.c, err = redisstream.NewBatchConsumer(cfg.Middleware, func(ctx context.Context, tx *sql.Tx, ds []*redisstream.Delivery) error {
			bodies := make([][]byte, len(ds))
			for i, d := range ds {
				bodies[i] = d.Payload()
			}
			return cfg.BatchHandler(ctx, tx, bodies)
		}, append(opts, redisstream.WithBatchSize(cfg.BatchSize))...)
	} else {
		c.c, err = redisstream.NewConsumer(cfg.Middleware, func(ctx context.Context, tx *sql.Tx, d *redisstream.Delivery) error {
			return cfg.Handler(ctx, tx, d.Payload())
		}, opts...)
	}
	return c, err
}

// redisConsumer is a consumer process: a client of its own and a Run.
type redisConsumer struct {
	tr     *redisTransport
	c      *redisstream.Consumer
	lose   func(key string) bool
	mu     sync.Mutex
	rdb    *redis.Client
	run    *running
	killed bool
}

// Start runs the consumer on a client of its own; an XACK the suite says
// to lose is dropped by a hook, so the entry stays pending and is
// re-claimed, as after a crash between commit and XACK.
func (c *redisConsumer) Start(context.Context) error {
	var hooks []redis.Hook
	if c.lose != nil {
		hooks = append(hooks, loseAcks{lose: func(id string) bool {
			k, ok := c.tr.keys.Load(id)
			return ok && c.lose(k.(string))
		}})
	}
	c.rdb = newClient(c.tr.t, c.tr.addr, hooks...)
	c.run = start(c.c, c.rdb, c.tr.stream, harnessGroup)
	return nil
}

func (c *redisConsumer) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.run == nil {
		return nil
	}
	c.run.cancel()
	var err error
	select {
	case err = <-c.run.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	c.run = nil
	_ = c.rdb.Close()
	if c.killed {
		return nil
	}
	return err
}

// Kill closes the client under Run, as a crash does: the XACKs of
// in-flight entries are lost, and they stay pending until the next
// consumer re-claims them.
func (c *redisConsumer) Kill() error {
	c.mu.Lock()
	c.killed = true
	c.mu.Unlock()
	return c.rdb.Close()
}

// Unsettled counts the group's pending entries (delivered, not XACKed)
// and its lag (entries not yet delivered).
func (tr *redisTransport) Unsettled(ctx context.Context) (int, error) {
	groups, err := tr.rdb.XInfoGroups(ctx, tr.stream).Result()
	if err != nil {
		return 0, err
	}
	for _, g := range groups {
		if g.Name == harnessGroup {
			if g.Lag < 0 {
				return 0, fmt.Errorf("redis cannot tell the lag of group %s on %s", g.Name, tr.stream)
			}
			return int(g.Pending + g.Lag), nil
		}
	}
	return 0, fmt.Errorf("no group %s on %s", harnessGroup, tr.stream)
}

// DeadLetters returns nil: the harness's consumers have no dead-letter
// stream (poison is XACKed and reported).
func (tr *redisTransport) DeadLetters(context.Context) ([]string, error) { return nil, nil }
