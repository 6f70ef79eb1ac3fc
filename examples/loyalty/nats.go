//go:build loyalty_nats

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent/adapter"
	idnats "github.com/txclaim/idempotent/nats"
	"github.com/txclaim/idempotent/rabbitmq"
)

// The NATS part: -broker nats, on the server of -nats.
func init() {
	brokers["nats"] = brokerMode{start: func(ctx context.Context, o options) (brokerSetup, error) {
		srv, err := startNats(ctx, o.natsURL, o.brokerDesc)
		if err != nil {
			return brokerSetup{}, err
		}
		return brokerSetup{
			desc:      srv.desc,
			newBroker: func() (broker, error) { return srv.newStream(ctx) },
			naive:     (*store).naiveNats, library: (*store).libraryNats,
			restart: 200 * time.Millisecond, close: srv.close,
		}, nil
	}}
}

// natsAckWait is the run's consumers' AckWait: how long a message delivered
// to a crashed process waits before the server delivers it again.
const natsAckWait = 2 * time.Second

// natsServer is the run's NATS server, reached through an admin connection.
type natsServer struct {
	url  string
	desc string
	nc   *natsgo.Conn
	js   jetstream.JetStream
}

// startNats checks that the server answers, with JetStream enabled.
func startNats(ctx context.Context, rawURL, desc string) (*natsServer, error) {
	s := &natsServer{url: rawURL, desc: desc}
	var err error
	if s.nc, err = natsgo.Connect(rawURL, natsgo.Name("loyalty-demo"), natsgo.Timeout(5*time.Second), natsgo.NoReconnect()); err != nil {
		return nil, fmt.Errorf("broker %s does not answer: %w", desc, err)
	}
	if s.js, err = jetstream.New(s.nc); err != nil {
		s.close()
		return nil, fmt.Errorf("broker %s: %w", desc, err)
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := s.js.AccountInfo(actx); err != nil {
		s.close()
		return nil, fmt.Errorf("broker %s: JetStream: %w", desc, err)
	}
	s.desc = desc[:len(desc)-1] + ", nats-server " + s.nc.ConnectedServerVersion() + ")"
	return s, nil
}

func (s *natsServer) close() { s.nc.Close() }

// newStream creates a run's stream, with a random name, deleted (with its
// consumers) by its close.
func (s *natsServer) newStream(ctx context.Context) (*natsStream, error) {
	name := "loyalty-demo-" + randomHex(4)
	t := &natsStream{s: s, name: name, subject: name + ".order-completed", consumers: map[string]bool{}}
	if _, err := s.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{t.subject},
		Storage: jetstream.MemoryStorage}); err != nil {
		return nil, fmt.Errorf("broker %s: create stream %s: %w", s.desc, name, err)
	}
	return t, nil
}

// natsStream is one run's stream; it implements broker.
type natsStream struct {
	s             *natsServer
	name, subject string

	mu        sync.Mutex
	consumers map[string]bool // durable names
}

func (t *natsStream) describe() string  { return t.s.desc }
func (t *natsStream) queueName() string { return t.name }

// publish publishes msgs to the stream, the message id in Nats-Msg-Id. An
// order published twice back to back is the producer's retry after a lost
// PubAck, later than the stream's duplicate window: the second copy has a
// new Nats-Msg-Id, so the stream keeps both.
func (t *natsStream) publish(ctx context.Context, msgs []amqp.Publishing) error {
	prev := ""
	for _, m := range msgs {
		id, _ := m.Headers[copyHeader].(int64)
		msgID := m.MessageId
		if msgID == prev {
			msgID += "-retry"
		}
		prev = m.MessageId
		nm := natsgo.NewMsg(t.subject)
		nm.Data = m.Body
		nm.Header.Set(jetstream.MsgIDHeader, msgID)
		nm.Header.Set(copyHeader, strconv.FormatInt(id, 10))
		for k, v := range m.Headers {
			if s, ok := v.(string); ok {
				nm.Header.Set(k, s)
			}
		}
		ack, err := t.s.js.PublishMsg(ctx, nm)
		if err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		if ack.Duplicate {
			return fmt.Errorf("publish: message id %s dropped by the stream as a duplicate", msgID)
		}
	}
	return nil
}

// pending is what the run's consumers have not had acked: messages not yet
// delivered, and delivered ones not acked (a crashed process's, delivered
// again after AckWait).
func (t *natsStream) pending(ctx context.Context) (int, error) {
	t.mu.Lock()
	names := make([]string, 0, len(t.consumers))
	for n := range t.consumers {
		names = append(names, n)
	}
	t.mu.Unlock()
	n := 0
	for _, name := range names {
		c, err := t.s.js.Consumer(ctx, t.name, name)
		if err != nil {
			return 0, err
		}
		info, err := c.Info(ctx)
		if err != nil {
			return 0, err
		}
		n += int(info.NumPending) + info.NumAckPending
	}
	return n, nil
}

// deadLettered is 0: the loyalty events are never poison.
func (t *natsStream) deadLettered(context.Context) (int, error) { return 0, nil }

// connect opens a consumer process's connection, which reconnects after a
// dropped socket, as NATS clients do.
func (t *natsStream) connect(context.Context) (brokerConn, error) {
	c := &natsConn{}
	nc, err := natsgo.Connect(t.s.url, natsgo.Name("loyalty-demo-consumer"), natsgo.SetCustomDialer(c),
		natsgo.MaxReconnects(-1), natsgo.ReconnectWait(20*time.Millisecond), natsgo.ReconnectJitter(0, 0),
		// The dropped sockets are the scenario's faults: nothing to log.
		natsgo.ErrorHandler(func(*natsgo.Conn, *natsgo.Subscription, error) {}))
	if err != nil {
		return nil, err
	}
	c.nc = nc
	if c.js, err = jetstream.New(nc); err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

// consumer creates (or finds) the durable pull consumer name on the
// process's connection. A request whose reply was lost to a dropped
// connection is sent again once the client has reconnected.
func (t *natsStream) consumer(ctx context.Context, conn *natsConn, name string) (jetstream.Consumer, error) {
	var c jetstream.Consumer
	var err error
	for range 5 {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c, err = conn.js.CreateOrUpdateConsumer(actx, t.name, jetstream.ConsumerConfig{
			Durable: name, AckPolicy: jetstream.AckExplicitPolicy, AckWait: natsAckWait, MaxDeliver: -1,
		})
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("create consumer %s: %w", name, err)
	}
	t.mu.Lock()
	t.consumers[name] = true
	t.mu.Unlock()
	return c, nil
}

func (t *natsStream) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return t.s.js.DeleteStream(ctx, t.name)
}

// natsConn is one consumer process's connection.
type natsConn struct {
	nc *natsgo.Conn
	js jetstream.JetStream

	mu    sync.Mutex
	conns []net.Conn
}

// Dial is the connection's dialer (natsgo.CustomDialer); it keeps the
// sockets for drop.
func (c *natsConn) Dial(network, address string) (net.Conn, error) {
	nc, err := (&net.Dialer{Timeout: 5 * time.Second}).Dial(network, address)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.conns = append(c.conns, nc)
	c.mu.Unlock()
	return nc, nil
}

// drop closes the connection's socket under the client, as a network
// failure does; the client reconnects.
func (c *natsConn) drop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, nc := range c.conns {
		_ = nc.Close()
	}
	c.conns = nil
}

// crash closes the connection at once: nothing buffered (an ack) leaves.
func (c *natsConn) crash() {
	c.drop()
	c.nc.Close()
}

func (c *natsConn) channel() (rabbitmq.Channel, error) {
	return nil, errors.New("a NATS connection has no AMQP channel")
}

func (c *natsConn) close() { c.nc.Close() }

// copyOfMsg returns the copy id a message carries.
func copyOfMsg(m jetstream.Msg) int64 {
	if id, err := strconv.ParseInt(m.Headers().Get(copyHeader), 10, 64); err == nil {
		return id
	}
	return -1
}

// naiveNats is the usual hand-written JetStream pull loop around the naive
// check-then-act: each worker fetches a message, checks then credits, and
// acks after the database has committed. A crash between the two leaves the
// message unacked, and the server delivers it again after AckWait.
func (s *store) naiveNats(ctx context.Context, customers int) (consumeFunc, creditedT, error) {
	apply, credited, err := s.naiveCredit(ctx, customers)
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context, sc *scenario, bc brokerConn) error {
		conn, t := bc.(*natsConn), sc.b.(*natsStream)
		cons, err := t.consumer(ctx, conn, "loyalty-naive")
		if err != nil {
			return err
		}
		var crashed atomic.Bool
		var wg sync.WaitGroup
		for range sc.workers {
			wg.Go(func() {
				for ctx.Err() == nil && !crashed.Load() {
					batch, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
					if err != nil {
						if crashed.Load() || ctx.Err() != nil || errors.Is(err, natsgo.ErrConnectionClosed) {
							return
						}
						continue // reconnecting: pull again
					}
					for m := range batch.Messages() {
						// A crash: committed, and the process dies
						// before its ack leaves.
						if !sc.naiveDeliver(ctx, apply, m.Data(), &crashed, conn.crash) {
							return
						}
						if m.Ack() == nil {
							sc.settle(copyOfMsg(m))
						}
					}
				}
			})
		}
		wg.Wait()
		if crashed.Load() {
			return errCrashed
		}
		return nil
	}, credited, nil
}

// libraryNats is the same consumer through nats.NewConsumer: the claim and
// the credit in one transaction, then DoubleAck.
func (s *store) libraryNats(ctx context.Context, customers int) (consumeFunc, creditedT, error) {
	mw, credit, credited, err := s.libraryCredit(ctx, customers)
	if err != nil {
		return nil, nil, err
	}
	// The key is the order id from the body: a natural key that survives
	// a replay tool assigning new message ids (Nats-Msg-Id).
	key := idnats.Prefixed("order-completed:", idnats.BodyField("order_id"))
	h := idnats.Decode(idnats.JSON[orderCompleted], func(ctx context.Context, tx *sql.Tx, o orderCompleted, _ jetstream.Msg) error {
		// The Consumer opens the transaction before the handler runs, so
		// the price lookup waits inside it here.
		priceLookup(ctx)
		return credit(ctx, tx, o)
	})
	return func(ctx context.Context, sc *scenario, bc brokerConn) error {
		conn, t := bc.(*natsConn), sc.b.(*natsStream)
		cons, err := t.consumer(ctx, conn, "loyalty-idempotent")
		if err != nil {
			return err
		}
		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var crashed atomic.Bool
		// Every message whose transaction committed reaches DoubleAck;
		// every crashEvery-th, the process dies before its ack leaves.
		crashing := ackHook{Consumer: cons, ack: func(ctx context.Context, m jetstream.Msg) error {
			n := sc.deliveries.Add(1)
			if sc.f.crashEvery > 0 && n%int64(sc.f.crashEvery) == 0 && !crashed.Swap(true) {
				sc.crashes.Add(1)
				conn.crash()
				cancel()
			}
			if err := m.DoubleAck(ctx); err != nil {
				return err
			}
			sc.settle(copyOfMsg(m))
			return nil
		}}
		obs := adapter.ObserverFunc(func(_ context.Context, e adapter.Event) {
			if e.Type == adapter.EventDuplicate {
				sc.duplicates.Add(1)
			}
		})
		c, err := idnats.NewConsumer(mw, h, idnats.WithKey(key), idnats.WithWorkers(sc.workers), idnats.WithFetchSize(1),
			idnats.WithObserver(obs), idnats.WithShutdownTimeout(time.Millisecond), idnats.WithRetryDelay(10*time.Millisecond, time.Second))
		if err != nil {
			return err
		}
		err = c.Run(pctx, crashing)
		if crashed.Load() {
			return errCrashed
		}
		return err
	}, credited, nil
}

// ackHook hands Run the messages of a JetStream consumer with their
// DoubleAck going through ack.
type ackHook struct {
	jetstream.Consumer
	ack func(ctx context.Context, m jetstream.Msg) error
}

func (h ackHook) Fetch(n int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	b, err := h.Consumer.Fetch(n, opts...)
	if err != nil {
		return b, err
	}
	out := hookedBatch{MessageBatch: b, msgs: make(chan jetstream.Msg)}
	go func() {
		defer close(out.msgs)
		for m := range b.Messages() {
			out.msgs <- hookedMsg{m, h.ack}
		}
	}()
	return out, nil
}

type hookedBatch struct {
	jetstream.MessageBatch
	msgs chan jetstream.Msg
}

func (b hookedBatch) Messages() <-chan jetstream.Msg { return b.msgs }

type hookedMsg struct {
	jetstream.Msg
	ack func(ctx context.Context, m jetstream.Msg) error
}

func (m hookedMsg) DoubleAck(ctx context.Context) error { return m.ack(ctx, m.Msg) }
