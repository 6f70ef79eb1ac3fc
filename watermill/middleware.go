package watermill

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
)

type txKey struct{}

// TxFromContext returns the transaction of the claim for the message being
// handled, or nil outside the middleware. A handler run by the middleware
// does all its database work through it, with the message's context:
//
//	tx := idwm.TxFromContext(msg.Context())
//	_, err := tx.ExecContext(msg.Context(), "UPDATE …")
//
// It must not commit or roll back the transaction.
func TxFromContext(ctx context.Context) *sql.Tx {
	tx, _ := ctx.Value(txKey{}).(*sql.Tx)
	return tx
}

// An Option configures the middleware.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	key          KeyFunc
	outbox       *outbox.Outbox
	outboxKind   string
	subscriberTx func(ctx context.Context) (*sql.Tx, bool)
	eventTime    EventTimeFunc
	rule         adapter.Rule
	now          func() time.Time
}

// WithKey sets where the message key comes from. Default is
// Metadata(KeyMetadata).
func WithKey(k KeyFunc) Option {
	return optionFunc(func(c *config) error {
		if k == nil {
			return errors.New("watermill: WithKey: nil key function")
		}
		c.key = k
		return nil
	})
}

// WithOutbox makes the messages a handler returns go out through the outbox
// ob: they are written, as rows of the given kind, in the claim's
// transaction, and a relay publishes them later with a [Sender] registered
// for that kind (outbox.WithSender(kind, sender)). They go out if and only
// if the effect commits, at least once, each with a stable idempotency key.
// The middleware returns no messages to the router, so give the handler no
// publish topic of the router's own (or use AddNoPublisherHandler with a
// handler that enqueues itself). Default is no outbox: a handler that returns
// messages fails with ErrProducedMessages.
func WithOutbox(ob *outbox.Outbox, kind string) Option {
	return optionFunc(func(c *config) error {
		if ob == nil {
			return errors.New("watermill: WithOutbox: nil outbox")
		}
		if kind == "" {
			return errors.New("watermill: WithOutbox: empty kind")
		}
		c.outbox, c.outboxKind = ob, kind
		return nil
	})
}

// WithSubscriberTx makes the middleware claim in the transaction the
// subscriber consumes the message in, rather than in one of its own, so
// that the claim, the effect and the subscriber's offset commit together.
// txOf returns that transaction from the message's context. With the
// watermill-sql (v4) subscriber:
//
//	idwm.WithSubscriberTx(func(ctx context.Context) (*sql.Tx, bool) {
//		tx, ok := wsql.TxFromContext(ctx)
//		if !ok {
//			return nil, false
//		}
//		std, ok := tx.(*wsql.StdSQLTx)
//		if !ok {
//			return nil, false
//		}
//		return std.Tx, true
//	})
//
// The subscriber commits its transaction; the middleware neither commits
// nor retries. Each attempt runs under a savepoint, rolled back when the
// handler fails: watermill-sql resends a nacked message in the same
// transaction (and shares one transaction among a batch of messages), so
// without it a failed attempt's claim would stay and mark the message seen.
// The claim table must be in the subscriber's database. A message without a transaction fails with ErrNoTransaction.
// Default is off: the middleware begins, retries and commits its own
// transaction on the *sql.DB of its idempotent.Middleware.
func WithSubscriberTx(txOf func(ctx context.Context) (*sql.Tx, bool)) Option {
	return optionFunc(func(c *config) error {
		if txOf == nil {
			return errors.New("watermill: WithSubscriberTx: nil function")
		}
		c.subscriberTx = txOf
		return nil
	})
}

// New returns a message.HandlerMiddleware that applies each message's
// effect exactly once with mw: it takes the message key (WithKey) and the
// producer's event time (WithEventTime: by default the metadata field
// adapter.EventTimeHeader), begins a transaction on mw's database, claims
// the message (idempotent.Middleware.ProcessMessage) and — only if the
// claim is new — runs the handler with the transaction in the message's
// context (TxFromContext), then commits claim and effect together. A
// duplicate skips the handler and returns success, so the router acks it.
//
// Every other answer goes through the one settle rule
// (adapter.Rule.Settle). A handler error rolls the claim back with the
// effect and is returned as a *RequeueError, so the router nacks the
// message and it comes back: a failed message is never marked seen. So is
// a claim the transaction could not make (serialization failures and lost
// connections are first retried under mw's retry policy, running the
// handler again), and an event time ahead of the clock within the rule's
// bound. A message that no redelivery can fix — no key (ErrNoKey), a bad
// event-time value, an event time older than the retention window or too
// far ahead, a handler error marked with Poison — fails with an error
// matching ErrPoison (see IsPoison), without opening a transaction where
// it can be told before one.
//
// A Middleware in partitioned mode (idempotent.WithDailyPartitions) needs
// every message's event time: with WithoutEventTime, New refuses it with an
// error matching adapter.ErrNoProducerEventTime. (With the default, a
// message without the header is poison in that mode.)
func New(mw *idempotent.Middleware, opts ...Option) (message.HandlerMiddleware, error) {
	if mw == nil {
		return nil, errors.New("watermill: New: nil middleware")
	}
	cfg := config{key: Metadata(KeyMetadata), eventTime: EventTimeMetadata(adapter.EventTimeHeader)}
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("watermill: New: nil option")
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	if err := adapter.CheckEventTimeSource(mw, "watermill: New", cfg.eventTime != nil); err != nil {
		return nil, err
	}
	cfg.rule = adapter.RuleFor(mw, idempotent.RetryPolicy{})
	cfg.now = mw.Now
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			m, err := cfg.message(msg)
			if err != nil {
				return nil, cfg.settle(m, err)
			}
			if cfg.subscriberTx != nil {
				return nil, cfg.settle(m, cfg.inSubscriberTx(mw, h, msg, m))
			}
			_, err = mw.ProcessMessage(msg.Context(), m, func(ctx context.Context, tx *sql.Tx) error {
				return cfg.run(ctx, tx, h, msg, m)
			})
			return nil, cfg.settle(m, err)
		}
	}, nil
}

// inSubscriberTx claims m in the subscriber's transaction and runs h in
// it when the claim is new.
func (c *config) inSubscriberTx(mw *idempotent.Middleware, h message.HandlerFunc, msg *message.Message, m idempotent.Message) error {
	key := m.Key
	ctx := msg.Context()
	tx, ok := c.subscriberTx(ctx)
	if !ok || tx == nil {
		return fmt.Errorf("%w: message %s", ErrNoTransaction, msg.UUID)
	}
	// The subscriber may keep its transaction across a nack (watermill-sql
	// resends a nacked message in the same transaction, and shares one
	// transaction among a batch of messages): a savepoint makes each
	// attempt's claim and effect roll back together, leaving the
	// transaction usable and the message not marked seen.
	if _, err := tx.ExecContext(ctx, "SAVEPOINT "+savepoint); err != nil {
		return fmt.Errorf("watermill: message %q: savepoint: %w", key, err)
	}
	err := func() error {
		claimed, err := mw.ClaimMessage(ctx, tx, m)
		if err != nil || !claimed {
			return err
		}
		return c.run(ctx, tx, h, msg, m)
	}()
	if err != nil {
		if _, rerr := tx.ExecContext(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT "+savepoint); rerr != nil {
			return fmt.Errorf("watermill: message %q: %w (and rolling back to the savepoint: %w)", key, err, rerr)
		}
		return err
	}
	if _, err := tx.ExecContext(ctx, "RELEASE SAVEPOINT "+savepoint); err != nil {
		return fmt.Errorf("watermill: message %q: release savepoint: %w", key, err)
	}
	return nil
}

// savepoint names the savepoint of an attempt in a subscriber's transaction.
const savepoint = "idempotent_watermill"

// run calls h with tx in the message's context, and enqueues the messages
// it returns.
func (c *config) run(ctx context.Context, tx *sql.Tx, h message.HandlerFunc, msg *message.Message, m idempotent.Message) error {
	key := m.Key
	orig := msg.Context()
	msg.SetContext(context.WithValue(ctx, txKey{}, tx))
	produced, err := h(msg)
	msg.SetContext(orig)
	if err != nil {
		return err
	}
	if len(produced) == 0 {
		return nil
	}
	if c.outbox == nil {
		return fmt.Errorf("%w: %d messages from the handler of %q", ErrProducedMessages, len(produced), key)
	}
	for i, p := range produced {
		if p.Metadata.Get(adapter.EventTimeHeader) == "" {
			// The produced event happens now: its time is stamped once,
			// in the row, so every relay retry carries the same one to
			// a consumer downstream.
			if p.Metadata == nil {
				p.Metadata = message.Metadata{}
			}
			p.Metadata.Set(adapter.EventTimeHeader, adapter.FormatEventTime(c.now()))
		}
		payload, err := json.Marshal(envelope{Metadata: p.Metadata, Payload: p.Payload})
		if err != nil {
			return fmt.Errorf("watermill: encode produced message %d: %w", i, err)
		}
		// Each produced message gets its own row key, derived from the
		// message key and its index: stable across redeliveries.
		rowKey := outbox.Key(c.outbox.Consumer(), key+"#"+strconv.Itoa(i), c.outboxKind)
		if _, err := c.outbox.Enqueue(ctx, tx, key, c.outboxKind, payload, outbox.WithKey(rowKey)); err != nil {
			return fmt.Errorf("watermill: enqueue produced message %d: %w", i, err)
		}
	}
	return nil
}

// envelope is a produced message as an outbox row carries it.
type envelope struct {
	Metadata map[string]string `json:"metadata,omitempty"`
	Payload  []byte            `json:"payload"`
}
