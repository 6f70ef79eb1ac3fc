//go:build loyalty_mqtt

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

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/mqtt"
	"github.com/txclaim/idempotent/rabbitmq"
)

// The MQTT part: -broker mqtt, on the MQTT 5 broker of -mqtt. Each
// consumer process is a persistent session (QoS 1) in one shared
// subscription, "$share/loyalty/…": the broker spreads the orders over
// the sessions, and a crashed process's session, resumed by the process
// that replaces it, gets back what it had not acknowledged.
func init() {
	brokers["mqtt"] = brokerMode{start: startMQTT}
}

// mqttBacklog is how many messages publish lets wait unacknowledged
// before it sends more: well inside the broker's queue per session
// (Mosquitto's max_queued_messages, 1000 by default, drops beyond it).
const mqttBacklog = 64

// startMQTT checks that the broker answers an MQTT 5 CONNECT.
func startMQTT(ctx context.Context, o options) (brokerSetup, error) {
	cli, err := mqttConnect(ctx, o.mqttAddr, "loyalty-demo-check-"+randomHex(4), 0, nil)
	if err != nil {
		return brokerSetup{}, fmt.Errorf("broker %s does not answer: %w", o.brokerDesc, err)
	}
	_ = cli.Disconnect(&paho.Disconnect{})
	return brokerSetup{
		desc:      o.brokerDesc,
		newBroker: func() (broker, error) { return newMQTTTopic(ctx, o) },
		naive:     (*store).naiveMQTT, library: (*store).libraryMQTT,
		restart: 200 * time.Millisecond,
	}, nil
}

// mqttConnect connects a paho client to addr over conn (a new TCP
// connection when nil) with CleanStart and the session expiry given.
func mqttConnect(ctx context.Context, addr, clientID string, expiry uint32, conn net.Conn) (*paho.Client, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if conn == nil {
		var err error
		if conn, err = (&net.Dialer{}).DialContext(cctx, "tcp", addr); err != nil {
			return nil, err
		}
	}
	cli := paho.NewClient(paho.ClientConfig{ClientID: clientID, Conn: conn})
	if _, err := cli.Connect(cctx, &paho.Connect{ClientID: clientID, CleanStart: true, KeepAlive: 30,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}}); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return cli, nil
}

// mqttTopic is one run's topic, its shared subscription and the sessions of
// its consumer processes; it implements broker.
type mqttTopic struct {
	addr, desc, topic, filter string
	pub                       *paho.Client

	sending sync.WaitGroup
	done    chan struct{}
	took    chan struct{} // signalled at each acknowledgement

	acks atomic.Int64 // PUBACKs the consumer processes wrote

	mu        sync.Mutex
	free      []string // sessions no live process holds
	sessions  []string
	total     int
	published int
	sendErr   error
}

// newMQTTTopic creates the run's topic and one persistent session per
// consumer process, subscribed to the shared subscription before anything
// is published, so that none of it is missed.
func newMQTTTopic(ctx context.Context, o options) (*mqttTopic, error) {
	name := "loyalty-demo/" + randomHex(4) + "/order-completed"
	t := &mqttTopic{addr: o.mqttAddr, desc: o.brokerDesc, topic: name, filter: "$share/loyalty/" + name,
		done: make(chan struct{}), took: make(chan struct{}, 1)}
	for i := range o.consumers {
		id := fmt.Sprintf("loyalty-demo-%s-%d", randomHex(4), i)
		cli, err := mqttConnect(ctx, t.addr, id, 3600, nil)
		if err != nil {
			return nil, fmt.Errorf("broker %s: %w", t.desc, err)
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = cli.Subscribe(sctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: t.filter, QoS: 1}}})
		cancel()
		_ = cli.Disconnect(&paho.Disconnect{})
		if err != nil {
			return nil, fmt.Errorf("broker %s: subscribe %s: %w", t.desc, t.filter, err)
		}
		t.sessions = append(t.sessions, id)
	}
	t.free = append(t.free, t.sessions...)
	var err error
	if t.pub, err = mqttConnect(ctx, t.addr, "loyalty-demo-pub-"+randomHex(4), 0, nil); err != nil {
		return nil, fmt.Errorf("broker %s: %w", t.desc, err)
	}
	return t, nil
}

func (t *mqttTopic) describe() string  { return t.desc }
func (t *mqttTopic) queueName() string { return t.filter }

// publish sends msgs at QoS 1 with the message id in the idempotency-key
// user property and the producer's event time in Idempotent-Event-Time,
// the properties the mqtt package reads, at the consumers' pace: never more
// than mqttBacklog messages ahead of their acknowledgements. It returns at
// once and sends in the background.
func (t *mqttTopic) publish(ctx context.Context, msgs []amqp.Publishing) error {
	t.mu.Lock()
	t.total += len(msgs)
	t.mu.Unlock()
	t.sending.Go(func() {
		if err := t.send(ctx, msgs); err != nil {
			t.mu.Lock()
			t.sendErr = err
			t.mu.Unlock()
		}
	})
	return nil
}

func (t *mqttTopic) send(ctx context.Context, msgs []amqp.Publishing) error {
	for i, m := range msgs {
		for {
			t.mu.Lock()
			ahead := int64(t.published) - t.acks.Load()
			t.mu.Unlock()
			if ahead < mqttBacklog {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-t.done:
				return errors.New("topic closed")
			case <-t.took:
			case <-time.After(100 * time.Millisecond): // an acknowledgement lost with a crash
			}
		}
		id, _ := m.Headers[copyHeader].(int64)
		props := paho.UserProperties{
			{Key: mqtt.DefaultKeyProperty, Value: m.MessageId},
			{Key: adapter.EventTimeHeader, Value: adapter.FormatEventTime(m.Timestamp)},
			{Key: copyHeader, Value: strconv.FormatInt(id, 10)},
		}
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := t.pub.Publish(pctx, &paho.Publish{Topic: t.topic, QoS: 1, Payload: m.Body, Properties: &paho.PublishProperties{User: props}})
		cancel()
		if err != nil {
			return fmt.Errorf("publish message %d: %w", i, err)
		}
		t.mu.Lock()
		t.published++
		t.mu.Unlock()
	}
	return nil
}

// pending is what the consumers have not acknowledged, and what publish
// has not sent yet: the broker reports no count, so the topic counts the
// PUBACKs its processes wrote.
func (t *mqttTopic) pending(context.Context) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return max(0, t.total-int(t.acks.Load())), t.sendErr
}

// deadLettered is 0: the loyalty events are never poison.
func (t *mqttTopic) deadLettered(context.Context) (int, error) { return 0, nil }

// connect opens a consumer process's client on a session no live process
// holds: a crashed process's, when there is one, which the broker then
// redelivers what it had not acknowledged to.
func (t *mqttTopic) connect(context.Context) (brokerConn, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.free) == 0 {
		return nil, errors.New("more consumer processes than sessions")
	}
	id := t.free[0]
	t.free = t.free[1:]
	return &mqttConn{t: t, clientID: id}, nil
}

// release hands a session back to the pool.
func (t *mqttTopic) release(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.free = append(t.free, id)
}

// close stops publishing and ends the run's sessions.
func (t *mqttTopic) close() error {
	close(t.done)
	t.sending.Wait()
	_ = t.pub.Disconnect(&paho.Disconnect{})
	for _, id := range t.sessions {
		if cli, err := mqttConnect(context.Background(), t.addr, id, 0, nil); err == nil {
			_ = cli.Disconnect(&paho.Disconnect{})
		}
	}
	return nil
}

// mqttConn is one consumer process's client: the session it holds, and
// the connections it dialled, whose writes it reads to count PUBACKs and
// to crash the process right before one leaves.
type mqttConn struct {
	t        *mqttTopic
	clientID string

	mu        sync.Mutex
	conns     []*ackConn
	killed    bool
	released  bool
	beforeAck func() (crash bool)
}

// dial opens a connection for the process, unless it has crashed.
func (c *mqttConn) dial(ctx context.Context) (net.Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.killed {
		return nil, errCrashed
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", c.t.addr)
	if err != nil {
		return nil, err
	}
	ac := &ackConn{Conn: conn, c: c}
	c.conns = append(c.conns, ac)
	return ac, nil
}

// drop closes the process's connections abruptly: what it had not
// acknowledged comes again on its session's next connection.
func (c *mqttConn) drop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ac := range c.conns {
		_ = ac.Conn.Close()
	}
}

// crash kills the process: nothing more leaves it, and its session is
// free for the process that replaces it.
func (c *mqttConn) crash() {
	c.mu.Lock()
	c.killed = true
	for _, ac := range c.conns {
		_ = ac.Conn.Close()
	}
	c.mu.Unlock()
	c.release()
}

func (c *mqttConn) dead() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.killed
}

func (c *mqttConn) release() {
	c.mu.Lock()
	released := c.released
	c.released = true
	c.mu.Unlock()
	if !released {
		c.t.release(c.clientID)
	}
}

func (c *mqttConn) channel() (rabbitmq.Channel, error) {
	return nil, errors.New("an MQTT session has no AMQP channel")
}

// close ends the process: its connections close, and its session is free.
func (c *mqttConn) close() {
	c.mu.Lock()
	for _, ac := range c.conns {
		_ = ac.Conn.Close()
	}
	c.mu.Unlock()
	c.release()
}

// ackConn is a connection whose writes are read packet by packet: each
// PUBACK is counted, and, when the process's beforeAck says so, the
// process crashes instead of writing it.
type ackConn struct {
	net.Conn
	c *mqttConn

	mu     sync.Mutex
	header bool // the next byte is a remaining-length byte
	shift  uint
	length int // bytes of the current packet still to come
	start  bool
}

func (a *ackConn) Write(b []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := 0; i < len(b); i++ {
		switch {
		case a.header:
			a.length |= int(b[i]&0x7f) << a.shift
			a.shift += 7
			a.header = b[i]&0x80 != 0
		case a.length > 0:
			a.length--
		default: // the first byte of a packet
			if b[i]>>4 == packets.PUBACK {
				a.c.mu.Lock()
				before, killed := a.c.beforeAck, a.c.killed
				a.c.mu.Unlock()
				if killed || (before != nil && before()) {
					if i > 0 {
						_, _ = a.Conn.Write(b[:i])
					}
					a.c.crash()
					return i, errCrashed
				}
				a.c.t.acks.Add(1)
				select {
				case a.c.t.took <- struct{}{}:
				default:
				}
			}
			a.header, a.shift, a.length = true, 0, 0
		}
	}
	return a.Conn.Write(b)
}

// copyOfPublish returns the copy id a message carries.
func copyOfPublish(p *paho.Publish) int64 {
	if p.Properties != nil {
		if id, err := strconv.ParseInt(p.Properties.User.Get(copyHeader), 10, 64); err == nil {
			return id
		}
	}
	return -1
}

// naiveMQTT is the usual hand-written paho consumer around the naive
// check-then-act: manual acknowledgement, each message credited and then
// acknowledged (PUBACK) after the database has committed, by the
// process's workers. A crash between the two leaves the message
// unacknowledged, and the broker sends it again on the session's next
// connection.
func (s *store) naiveMQTT(ctx context.Context, customers int) (consumeFunc, creditedT, error) {
	apply, credited, err := s.naiveCredit(ctx, customers)
	if err != nil {
		return nil, nil, err
	}
	return func(ctx context.Context, sc *scenario, bc brokerConn) error {
		conn := bc.(*mqttConn)
		var crashed atomic.Bool
		msgs := make(chan *paho.Publish, sc.workers)
		ended := make(chan struct{}) // the process's end: paho's callback stops waiting for a worker
		defer close(ended)
		nc, err := conn.dial(ctx)
		if err != nil {
			return errCrashed
		}
		cli := paho.NewClient(paho.ClientConfig{ClientID: conn.clientID, Conn: packets.NewThreadSafeConn(nc), EnableManualAcknowledgment: true,
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
				select {
				case msgs <- pr.Packet:
				case <-ended:
				}
				return true, nil
			}}})
		// The workers start first: a resumed session gets its
		// unacknowledged messages right after CONNACK.
		stopped := make(chan struct{}) // closed by a worker's crash: the others stop too
		// lost is closed when the connection drops. Workers wait on it,
		// not on cli.Done, which is theirs to read only once Connect has
		// returned (Connect sets what Done returns).
		lost := make(chan struct{})
		var once sync.Once
		crash := func() {
			once.Do(func() { close(stopped) })
			conn.crash()
		}
		var wg sync.WaitGroup
		for range sc.workers {
			wg.Go(func() {
				for !crashed.Load() {
					var m *paho.Publish
					select {
					case m = <-msgs:
					case <-ctx.Done():
						return
					case <-stopped:
						return
					case <-lost:
						return // the connection dropped: the process restarts
					}
					if !sc.naiveDeliver(ctx, apply, m.Payload, &crashed, crash) {
						return
					}
					if cli.Ack(m) == nil && !conn.dead() {
						sc.settle(copyOfPublish(m))
					}
				}
			})
		}
		expiry, window := uint32(3600), uint16(sc.workers)
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = cli.Connect(cctx, &paho.Connect{ClientID: conn.clientID, KeepAlive: 30,
			Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry, ReceiveMaximum: &window}})
		if err == nil {
			go func() {
				select {
				case <-cli.Done():
					close(lost)
				case <-ended:
				}
			}()
			_, err = cli.Subscribe(cctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: conn.t.filter, QoS: 1}}})
		}
		cancel()
		if err != nil {
			crash() // the workers stop, and the process restarts
		}
		wg.Wait()
		if crashed.Load() || ctx.Err() == nil {
			// A crash, or a dropped connection: the process restarts on
			// its session; nothing more is sent on this connection.
			crash()
			return errCrashed
		}
		_ = cli.Disconnect(&paho.Disconnect{})
		return nil
	}, credited, nil
}

// libraryMQTT is the same consumer through mqtt.NewConsumer on the
// process's session: the claim and the credit in one transaction, then the
// PUBACK; a dropped connection is dialled again and the session resumed.
func (s *store) libraryMQTT(ctx context.Context, customers int) (consumeFunc, creditedT, error) {
	mw, credit, credited, err := s.libraryCredit(ctx, customers)
	if err != nil {
		return nil, nil, err
	}
	// The key is the order id from the body, as for the other brokers.
	key := mqtt.Prefixed("order-completed:", mqtt.BodyField("order_id"))
	h := mqtt.Decode(mqtt.JSON[orderCompleted], func(ctx context.Context, tx *sql.Tx, o orderCompleted, _ *paho.Publish) error {
		priceLookup(ctx)
		return credit(ctx, tx, o)
	})
	return func(ctx context.Context, sc *scenario, bc brokerConn) error {
		conn := bc.(*mqttConn)
		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var crashed atomic.Bool
		// Every crashEvery-th PUBACK, the process dies before it leaves.
		conn.mu.Lock()
		conn.beforeAck = func() bool {
			if n := sc.acks.Add(1); sc.f.crashEvery > 0 && n%int64(sc.f.crashEvery) == 0 && !crashed.Swap(true) {
				sc.crashes.Add(1)
				cancel()
				return true
			}
			return false
		}
		conn.mu.Unlock()
		obs := adapter.ObserverFunc(func(_ context.Context, e adapter.Event) {
			switch e.Type {
			case adapter.EventDuplicate:
				sc.duplicates.Add(1)
				fallthrough
			case adapter.EventApplied, adapter.EventRequeued, adapter.EventDeadLettered:
				sc.deliveries.Add(1)
			}
			if p, ok := e.Detail.(*paho.Publish); ok && e.Type != adapter.EventRequeued && e.Type != adapter.EventFetchError && !conn.dead() {
				sc.settle(copyOfPublish(p))
			}
		})
		c, err := mqtt.NewConsumer(mw, h, mqtt.WithKey(key), mqtt.WithWorkers(sc.workers), mqtt.WithObserver(obs),
			mqtt.WithRetryDelay(10*time.Millisecond, time.Second))
		if err != nil {
			return err
		}
		err = c.Run(pctx, mqtt.Session{Dial: conn.dial, ClientID: conn.clientID, Filters: []string{conn.t.filter}, QoS: 1, SessionExpiry: time.Hour})
		if crashed.Load() || conn.dead() {
			return errCrashed
		}
		return err
	}, credited, nil
}
