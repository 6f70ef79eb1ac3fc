//go:build loyalty_redis

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/rabbitmq"
	"github.com/txclaim/idempotent/redisstream"
)

// The Redis part: -broker redis, on the server of -redis.
func init() {
	// The client logs what it also returns; the demo's errors are one line.
	redis.SetLogger(quietRedis{})
	brokers["redis"] = brokerMode{
		check: func(o options) error {
			if _, err := redis.ParseURL(o.redisURL); err != nil {
				return fmt.Errorf("-redis %s: %w", shownDSN(o.redisURL), err)
			}
			return nil
		},
		start: func(ctx context.Context, o options) (brokerSetup, error) {
			srv, err := startRedis(ctx, o.redisURL, o.brokerDesc)
			if err != nil {
				return brokerSetup{}, err
			}
			return brokerSetup{
				desc:      srv.desc,
				newBroker: func() (broker, error) { return srv.newStream(ctx) },
				naive:     (*store).naiveRedis, library: (*store).libraryRedis,
				restart: 200 * time.Millisecond, close: srv.close,
			}, nil
		},
	}
}

// quietRedis is go-redis's logger, silenced.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// redisGroup is the consumer group of the run's consumers. The library's
// Middleware is named "loyalty" too, as the redisstream package advises.
const redisGroup = "loyalty"

// redisClaimIdle is how long an entry stays pending to a consumer that no
// longer touches it — a crashed process's — before another consumer of the
// group re-claims it: the naive loop's XAUTOCLAIM bound and the library's
// WithClaimIdle.
const redisClaimIdle = 2 * time.Second

// redisServer is the run's Redis, reached through an admin client.
type redisServer struct {
	url   string
	desc  string
	admin *redis.Client
}

// startRedis checks that the server answers and reads its version.
func startRedis(ctx context.Context, rawURL, desc string) (*redisServer, error) {
	opts, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("broker %s: %w", desc, err)
	}
	opts.DialTimeout, opts.MaxRetries = 5*time.Second, -1
	s := &redisServer{url: rawURL, desc: desc, admin: redis.NewClient(opts)}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := s.admin.Info(pctx, "server").Result()
	if err != nil {
		s.close()
		return nil, fmt.Errorf("broker %s does not answer: %w", desc, err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			s.desc = desc[:len(desc)-1] + ", redis " + v + ")"
		}
	}
	return s, nil
}

func (s *redisServer) close() { _ = s.admin.Close() }

// newStream creates a run's stream, with a random name, and its consumer
// group; close deletes both.
func (s *redisServer) newStream(ctx context.Context) (*redisStream, error) {
	name := "loyalty-demo-" + randomHex(4)
	if err := s.admin.XGroupCreateMkStream(ctx, name, redisGroup, "0").Err(); err != nil {
		return nil, fmt.Errorf("broker %s: create stream %s: %w", s.desc, name, err)
	}
	return &redisStream{s: s, name: name, copies: map[string]int64{}}, nil
}

// redisStream is one run's stream; it implements broker.
type redisStream struct {
	s    *redisServer
	name string

	mu     sync.Mutex
	copies map[string]int64 // entry id → copy id
}

func (t *redisStream) describe() string  { return t.s.desc }
func (t *redisStream) queueName() string { return t.name }

// publish adds msgs to the stream as entries of the fields the redisstream
// package reads: the message id in idempotency_key, the producer's event
// time in Idempotent-Event-Time, the body in payload. An order published
// twice is a producer retrying an XADD whose reply it lost: Redis adds a
// second entry, with an id of its own.
func (t *redisStream) publish(ctx context.Context, msgs []amqp.Publishing) error {
	for len(msgs) > 0 {
		chunk := msgs[:min(len(msgs), 500)]
		msgs = msgs[len(chunk):]
		p := t.s.admin.Pipeline()
		cmds := make([]*redis.StringCmd, len(chunk))
		for i, m := range chunk {
			id, _ := m.Headers[copyHeader].(int64)
			values := []any{
				redisstream.DefaultKeyField, m.MessageId,
				adapter.EventTimeHeader, adapter.FormatEventTime(m.Timestamp),
				redisstream.PayloadField, m.Body,
				copyHeader, strconv.FormatInt(id, 10),
			}
			for k, v := range m.Headers {
				if s, ok := v.(string); ok {
					values = append(values, k, s)
				}
			}
			cmds[i] = p.XAdd(ctx, &redis.XAddArgs{Stream: t.name, Values: values})
		}
		if _, err := p.Exec(ctx); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		t.mu.Lock()
		for i, c := range cmds {
			id, _ := chunk[i].Headers[copyHeader].(int64)
			t.copies[c.Val()] = id
		}
		t.mu.Unlock()
	}
	return nil
}

// copyAt returns the copy id of the entry id.
func (t *redisStream) copyAt(id string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c, ok := t.copies[id]; ok {
		return c
	}
	return -1
}

// pending is what the group has not acknowledged: entries pending to a
// consumer (in flight, or left by a crashed one) and entries not yet read
// (the group's lag).
func (t *redisStream) pending(ctx context.Context) (int, error) {
	groups, err := t.s.admin.XInfoGroups(ctx, t.name).Result()
	if err != nil {
		return 0, fmt.Errorf("groups of %s: %w", t.name, err)
	}
	for _, g := range groups {
		if g.Name == redisGroup {
			return int(g.Pending + max(g.Lag, 0)), nil
		}
	}
	return 0, fmt.Errorf("stream %s has no group %s", t.name, redisGroup)
}

// deadLettered is 0: the loyalty events are never poison.
func (t *redisStream) deadLettered(context.Context) (int, error) { return 0, nil }

// connect opens a consumer process's client, whose pool dials again after
// a dropped socket, as Redis clients do.
func (t *redisStream) connect(context.Context) (brokerConn, error) {
	opts, err := redis.ParseURL(t.s.url)
	if err != nil {
		return nil, err
	}
	opts.DialTimeout = 5 * time.Second
	c := &redisConn{settled: func(id string) {}}
	c.rdb = redis.NewClient(opts)
	c.rdb.AddHook(c)
	return c, nil
}

func (t *redisStream) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return t.s.admin.Del(ctx, t.name).Err()
}

// redisConn is one consumer process's client. As a redis.Hook it keeps the
// client's sockets, for drop, and sees every XACK: it reports the entries
// Redis acknowledged, and crashes the process before an XACK leaves when
// beforeAck says so.
type redisConn struct {
	rdb *redis.Client

	mu        sync.Mutex
	conns     []net.Conn
	settled   func(id string)
	beforeAck func() (crash bool)
}

// errRedisCrash is the error of the XACKs a crash kept from leaving.
var errRedisCrash = errors.New("the consumer process crashed before its XACK left")

func (c *redisConn) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := next(ctx, network, addr)
		if err == nil {
			c.mu.Lock()
			c.conns = append(c.conns, nc)
			c.mu.Unlock()
		}
		return nc, err
	}
}

func (c *redisConn) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "xack" {
			return next(ctx, cmd)
		}
		return c.xack(ctx, []redis.Cmder{cmd}, func(ctx context.Context) error { return next(ctx, cmd) })
	}
}

func (c *redisConn) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var acks []redis.Cmder
		for _, cmd := range cmds {
			if cmd.Name() == "xack" {
				acks = append(acks, cmd)
			}
		}
		if len(acks) == 0 {
			return next(ctx, cmds)
		}
		return c.xack(ctx, acks, func(ctx context.Context) error { return next(ctx, cmds) })
	}
}

// xack sends acks with send, unless the process crashes first, and reports
// the entries of those that succeeded.
func (c *redisConn) xack(ctx context.Context, acks []redis.Cmder, send func(context.Context) error) error {
	c.mu.Lock()
	before, settled := c.beforeAck, c.settled
	c.mu.Unlock()
	if before != nil && before() {
		for _, cmd := range acks {
			cmd.SetErr(errRedisCrash)
		}
		return errRedisCrash
	}
	err := send(ctx)
	for _, cmd := range acks {
		if cmd.Err() != nil {
			continue
		}
		for _, a := range cmd.Args()[3:] { // xack stream group id...
			if id, ok := a.(string); ok {
				settled(id)
			}
		}
	}
	return err
}

// drop closes the client's sockets under it, as a network failure does;
// the client dials again for its next command.
func (c *redisConn) drop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, nc := range c.conns {
		_ = nc.Close()
	}
	c.conns = nil
}

// crash closes the client at once: nothing more leaves.
func (c *redisConn) crash() {
	c.drop()
	_ = c.rdb.Close()
}

func (c *redisConn) channel() (rabbitmq.Channel, error) {
	return nil, errors.New("a Redis connection has no AMQP channel")
}

func (c *redisConn) close() { _ = c.rdb.Close() }

// watch sets the hook's callbacks for a run on t.
func (c *redisConn) watch(sc *scenario, t *redisStream, beforeAck func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.settled = func(id string) { sc.settle(t.copyAt(id)) }
	c.beforeAck = beforeAck
}

// naiveRedis is the usual hand-written XREADGROUP/XACK loop around the
// naive check-then-act: each worker reads one entry, checks then credits,
// and acks after the database has committed; and each process re-claims,
// with XAUTOCLAIM, the entries of the group idle for longer than
// redisClaimIdle — those a crashed process left pending. A crash between
// the commit and the XACK leaves the entry pending, and another process
// delivers it again.
func (s *store) naiveRedis(ctx context.Context, customers int) (consumeFunc, creditedT, error) {
	apply, credited, err := s.naiveCredit(ctx, customers)
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context, sc *scenario, bc brokerConn) error {
		conn, t := bc.(*redisConn), sc.b.(*redisStream)
		conn.watch(sc, t, nil)
		rdb, name := conn.rdb, "loyalty-naive-"+randomHex(4)
		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var crashed atomic.Bool
		over := func(err error) bool {
			return crashed.Load() || pctx.Err() != nil || errors.Is(err, redis.ErrClosed)
		}
		reclaimed := make(chan redis.XMessage, 100)
		var wg sync.WaitGroup
		wg.Go(func() {
			tick := time.NewTicker(redisClaimIdle / 4)
			defer tick.Stop()
			for {
				select {
				case <-pctx.Done():
					return
				case <-tick.C:
				}
				for start := "0-0"; ; {
					msgs, next, err := rdb.XAutoClaim(pctx, &redis.XAutoClaimArgs{Stream: t.name, Group: redisGroup,
						Consumer: name, MinIdle: redisClaimIdle, Start: start, Count: 100}).Result()
					if err != nil {
						if over(err) {
							return
						}
						break // a dropped connection: next tick
					}
					for _, m := range msgs {
						select {
						case reclaimed <- m:
						case <-pctx.Done():
							return
						}
					}
					if start = next; start == "0-0" {
						break
					}
				}
			}
		})
		for range sc.workers {
			wg.Go(func() {
				defer cancel()
				for !over(nil) {
					var m redis.XMessage
					select {
					case m = <-reclaimed:
					default:
						res, err := rdb.XReadGroup(pctx, &redis.XReadGroupArgs{Group: redisGroup, Consumer: name,
							Streams: []string{t.name, ">"}, Count: 1, Block: 500 * time.Millisecond}).Result()
						if err != nil || len(res) == 0 || len(res[0].Messages) == 0 {
							if over(err) {
								return
							}
							continue // nothing new, or a dropped connection: read again
						}
						m = res[0].Messages[0]
					}
					payload, _ := m.Values[redisstream.PayloadField].(string)
					// A crash: committed, and the process dies before its
					// XACK leaves.
					if !sc.naiveDeliver(pctx, apply, []byte(payload), &crashed, conn.crash) {
						return
					}
					_ = rdb.XAck(pctx, t.name, redisGroup, m.ID).Err() // a lost XACK: re-claimed later
				}
			})
		}
		wg.Wait()
		if crashed.Load() {
			return errCrashed
		}
		if ctx.Err() != nil {
			return nil
		}
		return amqp.ErrClosed // the client was closed under the process
	}, credited, nil
}

// libraryRedis is the same consumer through redisstream.NewConsumer: the
// claim and the credit in one transaction, then XACK; it re-claims what a
// crashed process left pending after redisClaimIdle.
func (s *store) libraryRedis(ctx context.Context, customers int) (consumeFunc, creditedT, error) {
	mw, credit, credited, err := s.libraryCredit(ctx, customers)
	if err != nil {
		return nil, nil, err
	}
	// The key is the order id from the payload: a natural key that
	// survives a replay tool assigning new message ids (idempotency_key).
	key := redisstream.Prefixed("order-completed:", redisstream.BodyField("order_id"))
	h := redisstream.Decode(redisstream.JSON[orderCompleted], func(ctx context.Context, tx *sql.Tx, o orderCompleted, _ *redisstream.Delivery) error {
		// The Consumer opens the transaction before the handler runs, so
		// the price lookup waits inside it here.
		priceLookup(ctx)
		return credit(ctx, tx, o)
	})
	return func(ctx context.Context, sc *scenario, bc brokerConn) error {
		conn, t := bc.(*redisConn), sc.b.(*redisStream)
		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var crashed atomic.Bool
		// Every entry whose transaction committed reaches an XACK; every
		// crashEvery-th, the process dies before it leaves.
		conn.watch(sc, t, func() bool {
			n := sc.acks.Add(1)
			if sc.f.crashEvery > 0 && n%int64(sc.f.crashEvery) == 0 && !crashed.Swap(true) {
				sc.crashes.Add(1)
				conn.crash()
				cancel()
				return true
			}
			return crashed.Load()
		})
		obs := adapter.ObserverFunc(func(_ context.Context, e adapter.Event) {
			switch e.Type {
			case adapter.EventDuplicate:
				sc.duplicates.Add(1)
				fallthrough
			case adapter.EventApplied, adapter.EventRequeued, adapter.EventDeadLettered:
				sc.deliveries.Add(1)
			}
		})
		c, err := redisstream.NewConsumer(mw, h, redisstream.WithKey(key), redisstream.WithWorkers(sc.workers),
			redisstream.WithClaimIdle(redisClaimIdle), redisstream.WithBlock(500*time.Millisecond),
			redisstream.WithObserver(obs), redisstream.WithShutdownTimeout(time.Millisecond),
			redisstream.WithRetryDelay(10*time.Millisecond, time.Second))
		if err != nil {
			return err
		}
		err = c.Run(pctx, conn.rdb, t.name, redisGroup)
		switch {
		case crashed.Load():
			return errCrashed
		case errors.Is(err, redisstream.ErrClientClosed) && ctx.Err() != nil:
			return nil
		}
		return err
	}, credited, nil
}
