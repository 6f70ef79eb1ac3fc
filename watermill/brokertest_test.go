package watermill_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/brokertest"
	idwm "github.com/txclaim/idempotent/watermill"
)

// TestBrokertest runs the adapters' conformance suite on Watermill's
// GoChannel (persistent, so a message published before the router starts
// is delivered) and on watermill-amqp over the real RabbitMQ, each with a
// poison queue filtered by adapter.IsPoison on the router. A Watermill
// handler has no batches, so the suite runs per message only.
func TestBrokertest(t *testing.T) {
	t.Run("gochannel", func(t *testing.T) { brokertest.Run(t, goChannelHarness{}) })
	t.Run("amqp", func(t *testing.T) { brokertest.Run(t, amqpHarness{}) })
}

// goChannelHarness: GoChannel lives in the process, so it has no crash to
// survive (no Kill); persistent, it replays every message to a new
// subscriber (Restart).
type goChannelHarness struct{}

func (goChannelHarness) Features() brokertest.Features {
	return brokertest.Features{LoseAck: true, Restart: true, DeadLetter: true, RequeueDelay: true, TransportTime: true, Ordered: true}
}

func (goChannelHarness) Open(t *testing.T) brokertest.Transport {
	pubsub := newGoChannel(t)
	return &wmTransport{
		topic: "orders",
		pub:   pubsub,
		// The router closes its subscriber on Close, which must end this
		// consumer's subscription only, not the Pub/Sub the next consumer
		// subscribes to. GoChannel gives every subscription every message,
		// so one subscription serves all workers.
		subscribe: func(int) (message.Subscriber, func() error, error) {
			return &subscription{sub: pubsub}, func() error { return nil }, nil
		},
	}
}

// amqpHarness: watermill-amqp on a durable queue of the scenario's own.
// Each consumer has a connection of its own, which Kill closes: RabbitMQ
// requeues what it had not acked. Each worker is a handler of its own on
// the queue, a competing consumer.
type amqpHarness struct{}

func (amqpHarness) Features() brokertest.Features {
	return brokertest.Features{LoseAck: true, Kill: true, Restart: true, DeadLetter: true, RequeueDelay: true, TransportTime: true, Ordered: true}
}

func (amqpHarness) Open(t *testing.T) brokertest.Transport {
	url := amqpURL(t)
	topic := amqpQueue(t, url)
	amqpQueueNamed(t, url, topic+".poison")
	return &amqpTransport{url: url, wmTransport: &wmTransport{
		topic:   topic,
		pub:     amqpPublisher(t, url),
		workers: true,
		subscribe: func(int) (message.Subscriber, func() error, error) {
			cfg := amqpConfig(url)
			conn, err := wamqp.NewConnection(cfg.Connection, watermill.NopLogger{})
			if err != nil {
				return nil, nil, err
			}
			sub, err := wamqp.NewSubscriberWithConnection(cfg, watermill.NopLogger{}, conn)
			if err != nil {
				_ = conn.Close()
				return nil, nil, err
			}
			return sub, conn.Close, nil
		},
	}}
}

// amqpTransport is a wmTransport on RabbitMQ, which the suite inspects
// (brokertest.Inspector).
type amqpTransport struct {
	*wmTransport
	url  string
	mu   sync.Mutex
	dead []string // the keys read from the poison queue
}

// onChannel runs f on a channel of a connection of its own.
func (tr *amqpTransport) onChannel(f func(ch *amqp.Channel) error) error {
	conn, err := amqp.Dial(tr.url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	return f(ch)
}

// Unsettled counts the queue's ready messages: once the consumers'
// connections closed, RabbitMQ has put back what they did not ack.
func (tr *amqpTransport) Unsettled(context.Context) (int, error) {
	n := 0
	err := tr.onChannel(func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(tr.topic, true, false, false, false, nil)
		n = q.Messages
		return err
	})
	return n, err
}

// DeadLetters reads the poison queue, keeping what it read: the keys
// (Watermill UUIDs) of every dead letter so far.
func (tr *amqpTransport) DeadLetters(context.Context) ([]string, error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	err := tr.onChannel(func(ch *amqp.Channel) error {
		for {
			d, ok, err := ch.Get(tr.topic+".poison", true)
			if err != nil || !ok {
				return err
			}
			key, _ := d.Headers[wamqp.MessageUUIDHeaderKey].(string)
			tr.dead = append(tr.dead, key)
		}
	})
	return tr.dead, err
}

// wmTransport is a Watermill Pub/Sub topic.
type wmTransport struct {
	topic string
	pub   message.Publisher
	// subscribe returns a consumer's subscriber and what crashes it
	// (closes its connection).
	subscribe func(consumer int) (message.Subscriber, func() error, error)
	// workers: a handler per worker, competing on the topic.
	workers bool

	mu        sync.Mutex
	consumers int
}

// Publish sets the key as the UUID (the default key), the headers as
// metadata, and the transport time as the metadata a Pub/Sub might stamp
// ("published_at"), which the handler must not read.
func (tr *wmTransport) Publish(_ context.Context, m brokertest.Message) error {
	msg := message.NewMessage(m.Key, m.Body)
	for k, v := range m.Headers {
		msg.Metadata.Set(k, v)
	}
	if !m.TransportTime.IsZero() {
		msg.Metadata.Set("published_at", adapter.FormatEventTime(m.TransportTime))
	}
	return tr.pub.Publish(tr.topic, msg)
}

// NewConsumer builds a router: the poison queue (adapter.IsPoison) and a
// lost ack around NewHandler's handler.
func (tr *wmTransport) NewConsumer(cfg brokertest.ConsumerConfig) (brokertest.Consumer, error) {
	opts := []idwm.Option{idwm.WithObserver(cfg.Observer)}
	if cfg.NoEventTime {
		opts = append(opts, idwm.WithoutEventTime())
	}
	h, err := idwm.NewHandler(cfg.Middleware, func(ctx context.Context, tx *sql.Tx, msg *message.Message) error {
		return cfg.Handler(ctx, tx, msg.Payload)
	}, opts...)
	if err != nil {
		return nil, err
	}
	poisonQ, err := middleware.PoisonQueueWithFilter(tr.pub, tr.topic+".poison", adapter.IsPoison)
	if err != nil {
		return nil, err
	}
	loseAck := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil && cfg.LoseAck != nil && cfg.LoseAck(msg.UUID) {
				return nil, errors.New("the ack lost after the commit")
			}
			return out, err
		}
	}
	tr.mu.Lock()
	tr.consumers++
	n := tr.consumers
	tr.mu.Unlock()
	sub, crash, err := tr.subscribe(n)
	if err != nil {
		return nil, err
	}
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		_ = crash()
		return nil, err
	}
	r.AddMiddleware(poisonQ, loseAck)
	workers := 1
	if tr.workers {
		workers = max(cfg.Workers, 1)
	}
	for w := range workers {
		r.AddConsumerHandler(fmt.Sprintf("brokertest-%d", w), tr.topic, sub, h)
	}
	return &wmConsumer{r: r, crash: crash}, nil
}

// subscription is one consumer's subscriber on a shared Pub/Sub: Close
// ends this subscription only.
type subscription struct {
	sub    message.Subscriber
	mu     sync.Mutex
	cancel []context.CancelFunc
}

func (s *subscription) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	ctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	s.cancel = append(s.cancel, cancel)
	s.mu.Unlock()
	return s.sub.Subscribe(ctx, topic)
}

func (s *subscription) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.cancel {
		c()
	}
	return nil
}

// wmConsumer runs its router.
type wmConsumer struct {
	r     *message.Router
	crash func() error
	once  sync.Once
	done  chan error
}

func (c *wmConsumer) Start(ctx context.Context) error {
	c.done = make(chan error, 1)
	go func() { c.done <- c.r.Run(context.Background()) }()
	select {
	case <-c.r.Running():
		return nil
	case err := <-c.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stop closes the router, which waits for running handlers, then the
// consumer's connection.
func (c *wmConsumer) Stop(context.Context) error {
	var err error
	c.once.Do(func() {
		if err = c.r.Close(); err == nil {
			err = <-c.done
		}
		err = errors.Join(err, c.crash())
	})
	return err
}

// Kill closes the consumer's connection under the router, without waiting
// for its handlers: the broker requeues what it had not acked. GoChannel
// has no connection to close.
func (c *wmConsumer) Kill() error {
	if err := c.crash(); err != nil {
		return err
	}
	// The killed router's handlers end with their closed subscription;
	// Stop then finds them done.
	go func() { _ = c.Stop(context.Background()) }()
	return nil
}
