package watermill_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/brokertest"
	idwm "github.com/txclaim/idempotent/watermill"
)

// TestBrokertest runs the adapters' conformance suite on Watermill's
// GoChannel (persistent, so a message published before the router starts
// is delivered), with a poison queue outside the middleware.
func TestBrokertest(t *testing.T) {
	brokertest.Run(t, goChannelHarness{})
}

type goChannelHarness struct{}

// Features: GoChannel lives in the process, so it has no crash to survive
// (no Kill); persistent, it replays every message to a new subscriber
// (Restart); a Watermill handler has no batches.
func (goChannelHarness) Features() brokertest.Features {
	return brokertest.Features{LoseAck: true, Restart: true, DeadLetter: true, RequeueDelay: true, TransportTime: true}
}

func (goChannelHarness) Open(t *testing.T) brokertest.Transport {
	return &wmTransport{pubsub: newGoChannel(t)}
}

// wmTransport is a Watermill Pub/Sub, topic "orders".
type wmTransport struct {
	pubsub interface {
		message.Publisher
		message.Subscriber
	}
}

// Publish sets the key in KeyMetadata, the headers as metadata, and the
// transport time as the metadata a Pub/Sub might stamp ("published_at"),
// which the middleware must not read.
func (tr *wmTransport) Publish(_ context.Context, m brokertest.Message) error {
	msg := message.NewMessage(watermill.NewUUID(), m.Body)
	msg.Metadata.Set(idwm.KeyMetadata, m.Key)
	for k, v := range m.Headers {
		msg.Metadata.Set(k, v)
	}
	if !m.TransportTime.IsZero() {
		msg.Metadata.Set("published_at", adapter.FormatEventTime(m.TransportTime))
	}
	return tr.pubsub.Publish("orders", msg)
}

// NewConsumer builds a router: a lost ack outermost, then the poison queue
// (IsPoison), then the settlement report, then this middleware around the
// handler.
func (tr *wmTransport) NewConsumer(cfg brokertest.ConsumerConfig) (brokertest.Consumer, error) {
	var opts []idwm.Option
	if cfg.NoEventTime {
		opts = append(opts, idwm.WithoutEventTime())
	}
	ours, err := idwm.New(cfg.Middleware, opts...)
	if err != nil {
		return nil, err
	}
	poisonQ, err := middleware.PoisonQueueWithFilter(tr.pubsub, "orders.poison", idwm.IsPoison)
	if err != nil {
		return nil, err
	}
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	report := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			s := brokertest.Settlement{Key: msg.Metadata.Get(idwm.KeyMetadata), Action: adapter.Ack, Err: err}
			var re *idwm.RequeueError
			switch {
			case idwm.IsPoison(err):
				s.Action = adapter.DeadLetter
			case errors.As(err, &re):
				s.Action, s.Delay = adapter.Requeue, re.Delay
			case err != nil:
				s.Action = adapter.Requeue
			}
			cfg.OnSettle(s)
			return out, err
		}
	}
	loseAck := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil && cfg.LoseAck != nil && cfg.LoseAck(msg.Metadata.Get(idwm.KeyMetadata)) {
				return nil, errors.New("the ack lost after the commit")
			}
			return out, err
		}
	}
	r.AddMiddleware(loseAck, poisonQ, report, ours)
	r.AddNoPublisherHandler("brokertest", "orders", &subscription{sub: tr.pubsub}, func(msg *message.Message) error {
		return cfg.Handler(msg.Context(), idwm.TxFromContext(msg.Context()), msg.Payload)
	})
	return &wmConsumer{r: r}, nil
}

// subscription is one consumer's subscriber on the shared Pub/Sub: the
// router closes its subscriber on Close, which must end this
// subscription only, not the Pub/Sub the next consumer subscribes to.
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
	r    *message.Router
	once sync.Once
	done chan error
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

// Stop closes the router, which waits for running handlers.
func (c *wmConsumer) Stop(context.Context) error {
	var err error
	c.once.Do(func() {
		if err = c.r.Close(); err == nil {
			err = <-c.done
		}
	})
	return err
}

func (c *wmConsumer) Kill() error { return errors.New("GoChannel: no crash to simulate") }
