package mqtt_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/mqtt"
	"github.com/txclaim/idempotent/postgres"
)

// The tests run against the real test Postgres (IDEMPOTENT_POSTGRES_DSN)
// and Mosquitto at IDEMPOTENT_MQTT_ADDR (default 127.0.0.1:1883, started
// by scripts/services.sh); without them they skip, except under CI.

// brokerAddr returns the broker's address, or calls Unavailable.
func brokerAddr(t testing.TB) string {
	t.Helper()
	addr := testenv.Getenv("IDEMPOTENT_MQTT_ADDR", "127.0.0.1:1883")
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		testenv.Unavailable(t, "no MQTT broker at %s: %v", addr, err)
	}
	_ = c.Close()
	return addr
}

// connect returns a paho client connected to addr (CleanStart, no
// session kept unless expiry is set), disconnected in Cleanup.
func connect(t testing.TB, addr, clientID string, expiry uint32) *paho.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	cli := paho.NewClient(paho.ClientConfig{ClientID: clientID, Conn: conn})
	if _, err := cli.Connect(ctx, &paho.Connect{ClientID: clientID, CleanStart: true, KeepAlive: 30,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}}); err != nil {
		t.Fatalf("connect %s: %v", clientID, err)
	}
	t.Cleanup(func() { _ = cli.Disconnect(&paho.Disconnect{}) })
	return cli
}

// openSession creates the persistent session clientID subscribed to
// filter at qos, then leaves it, so that what is published from now on is
// kept for the consumer that resumes it.
func openSession(t testing.TB, addr, clientID, filter string, qos byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli := connect(t, addr, clientID, 600)
	if _, err := cli.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: qos}}}); err != nil {
		t.Fatalf("subscribe %s: %v", filter, err)
	}
	if err := cli.Disconnect(&paho.Disconnect{}); err != nil {
		t.Fatal(err)
	}
}

// publish sends body to topic at qos with the key and headers as user
// properties, and waits for the broker's PUBACK or PUBCOMP.
func publish(ctx context.Context, cli *paho.Client, topic string, qos byte, key string, headers map[string]string, body []byte) error {
	props := paho.UserProperties{{Key: mqtt.DefaultKeyProperty, Value: key}}
	for k, v := range headers {
		props = append(props, paho.UserProperty{Key: k, Value: v})
	}
	_, err := cli.Publish(ctx, &paho.Publish{Topic: topic, QoS: qos, Payload: body, Properties: &paho.PublishProperties{User: props}})
	return err
}

// ledger is the loyalty service on a schema of the test's own.
type ledger struct {
	db     *sql.DB
	schema string
	mw     *idempotent.Middleware
}

type order = testenv.Order

func newLedger(t testing.TB) *ledger {
	t.Helper()
	db := testenv.OpenPostgres(t, 24)
	schema := testenv.LoyaltySchema(t, db, "mqtt")
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(schema+".processed_messages"))
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.EnsureSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &ledger{db: db, schema: schema, mw: mw}
}

// handler credits the order in the payload through tx.
func (l *ledger) handler() mqtt.Handler {
	return mqtt.Decode(mqtt.JSON[order], func(ctx context.Context, tx *sql.Tx, o order, _ *paho.Publish) error {
		return testenv.Credit(ctx, tx, l.schema, o)
	})
}

// sendOrder publishes o with its key and event time.
func sendOrder(t testing.TB, cli *paho.Client, topic string, qos byte, o order) {
	t.Helper()
	body, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := publish(context.Background(), cli, topic, qos, o.Key(), map[string]string{adapter.EventTimeHeader: adapter.FormatEventTime(time.Now())}, body); err != nil {
		t.Fatal(err)
	}
}

// proc is one consumer process: a Run of a Consumer on a session, over
// connections it can mute (what the client sends goes nowhere, as a
// process that froze) and cut (a crash).
type proc struct {
	c      *mqtt.Consumer
	addr   string
	cancel context.CancelFunc
	done   chan error

	mu     sync.Mutex
	conns  []*muteConn
	muted  bool
	killed bool
}

// newProc returns a process of c on the broker at addr, not started.
func newProc(c *mqtt.Consumer, addr string) *proc {
	return &proc{c: c, addr: addr, done: make(chan error, 1)}
}

// start runs the process's Consumer on the session clientID subscribed to
// filter.
func (p *proc) start(clientID, filter string, qos byte) {
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	s := mqtt.Session{Dial: p.dial, ClientID: clientID, Filters: []string{filter}, QoS: qos, SessionExpiry: 10 * time.Minute}
	go func() { p.done <- p.c.Run(ctx, s) }()
}

// startProc runs c on the session clientID subscribed to filter.
func startProc(c *mqtt.Consumer, addr, clientID, filter string, qos byte) *proc {
	p := newProc(c, addr)
	p.start(clientID, filter, qos)
	return p
}

func (p *proc) dial(ctx context.Context) (net.Conn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.killed {
		return nil, net.ErrClosed
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	mc := &muteConn{Conn: conn}
	mc.muted.Store(p.muted)
	p.conns = append(p.conns, mc)
	return mc, nil
}

// mute makes every write of the process's connections vanish from now on:
// what the client sends (its acknowledgements) never reaches the broker.
func (p *proc) mute() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.muted = true
	for _, c := range p.conns {
		c.muted.Store(true)
	}
}

// kill crashes the process: its connections close without DISCONNECT, it
// dials no more, and its Run is told to stop without anyone waiting.
func (p *proc) kill() {
	p.mu.Lock()
	p.killed = true
	for _, c := range p.conns {
		_ = c.Conn.Close()
	}
	p.mu.Unlock()
	p.cancel()
}

// stop ends the Run gracefully and waits for it.
func (p *proc) stop(t testing.TB) {
	t.Helper()
	p.cancel()
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return within 60s of its context's end")
	}
}
