package watermill

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

// A Handler applies one message's effect, in tx, the claim's transaction,
// with ctx: it runs only when the message's claim is new, and its effect
// commits with the claim. It must do all its database work through tx and
// must not commit or roll it back. An error rolls back the claim and the
// effect; one marked with adapter.Poison (or adapter.ErrUndecodable, or
// one a [WithPoison] predicate recognises) makes the message poison.
type Handler func(ctx context.Context, tx *sql.Tx, msg *message.Message) error

// transport is what a Watermill message carries, for adapter.Config: its
// UUID, the default key, and its metadata; no transport time.
var transport = adapter.Transport[*message.Message]{
	Name:       "watermill",
	DefaultKey: UUID(),
	Header:     metadata,
	Payload:    func(m *message.Message) []byte { return m.Payload },
	// Some subscribers redeliver a nacked message before any behind it
	// (Watermill's Kafka and SQL subscribers); the handler cannot tell
	// which one feeds it.
	Ordered:   true,
	System:    "watermill",
	MessageID: func(m *message.Message) string { return m.UUID },
}

// NewHandler returns the router handler that applies each message's effect
// exactly once with mw: for each message it reads the key (by default the
// UUID, see [WithKey]) and the producer's event time (by default the
// metadata field adapter.EventTimeHeader, see [WithEventTime]), begins a
// transaction on mw's database, claims the message
// (idempotent.Middleware.ProcessMessage) and — only if the claim is new —
// runs h in that transaction, then commits claim and effect together, and
// returns nil: the router acks. A duplicate skips h and returns nil.
//
// Every other answer goes through the one settle rule
// (adapter.Rule.Settle). What a later delivery may fix — h's error, a
// claim the transaction could not make, an event time a little ahead of
// the clock — rolls back and returns a [*RequeueError]: the router nacks,
// and the message comes back. What none can fix — no key, a bad event
// time, one older than the retention window or too far ahead, a poison
// error of h's — rolls back (or opens no transaction) and returns an error
// matching adapter.ErrPoison, for the router's
// middleware.PoisonQueueWithFilter(pub, topic, adapter.IsPoison).
//
// Register it with router.AddConsumerHandler.
// It is the handler, not a middleware, so every router middleware wraps
// the whole claim, effect and commit: middleware.Retry re-runs it as a new
// claim in a new transaction, a PoisonQueue sees only what the rule
// decided, and no middleware can get between the claim and its commit.
//
// With [WithTenant], mw is nil and each message is applied with its
// tenant's Middleware.
//
// NewHandler fails for a nil mw or h, a bad option, or a Middleware in
// partitioned mode (idempotent.WithDailyPartitions) with
// [WithoutEventTime]: that error matches adapter.ErrNoProducerEventTime.
func NewHandler(mw *idempotent.Middleware, h Handler, opts ...Option) (message.NoPublishHandlerFunc, error) {
	if h == nil {
		return nil, errors.New("watermill: NewHandler: nil Handler")
	}
	c := &config{Config: adapter.NewConfig(transport)}
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("watermill: NewHandler: nil Option")
		}
		if err := o.apply(c); err != nil {
			return nil, err
		}
	}
	if err := c.Check(mw); err != nil {
		return nil, err
	}
	if c.subscriberTx != nil {
		if mw == nil {
			return nil, errors.New("watermill: NewHandler: WithSubscriberTx and WithTenant: the subscriber's transaction is on one database, each tenant's claim table on its own; drop one of them")
		}
		if err := c.RefuseOrdering("WithSubscriberTx"); err != nil {
			return nil, err
		}
	}
	r := &run{c: c, mw: mw, h: h, rule: c.Rule(), obs: c.Observer()}
	return r.handle, nil
}

// Decode returns a Handler that decodes each message's payload with decode
// and calls h with the result, in the claim's transaction. A decode error
// is poison: it is marked with adapter.ErrUndecodable unless it matches
// adapter.ErrPoison already, and nothing is written.
func Decode[M any](decode func(payload []byte) (M, error), h func(ctx context.Context, tx *sql.Tx, m M, msg *message.Message) error) Handler {
	return adapter.DecodeHandler(func(msg *message.Message) []byte { return msg.Payload },
		func(msg *message.Message) string { return "watermill: message " + msg.UUID }, decode, h)
}

// JSON decodes a JSON payload into an M, for [Decode]. Its error matches
// adapter.ErrUndecodable.
func JSON[M any](payload []byte) (M, error) { return adapter.JSON[M](payload) }

// run is one handler NewHandler built.
type run struct {
	c    *config
	mw   *idempotent.Middleware
	h    Handler
	rule adapter.Rule
	obs  adapter.Observer
	// serial runs the messages of one ordering key one at a time.
	serial adapter.Serial
}

// handle applies msg and settles it: nil (ack), a *RequeueError (nack), or
// an error matching adapter.ErrPoison.
func (r *run) handle(msg *message.Message) error {
	ctx := msg.Context()
	m, err := r.c.Message(msg)
	tctx, end := r.c.StartTrace(ctx, msg, m)
	if err != nil {
		end(0, err)
		return r.settle(ctx, msg, m, err)
	}
	var outcome idempotent.Outcome
	if r.c.subscriberTx != nil {
		outcome, err = r.inSubscriberTx(tctx, msg, m)
	} else {
		// With ordering, one entity's messages run one at a time in this
		// process, whatever the router runs concurrently: two would hold
		// two transactions, one waiting on the other's lock of the
		// entity's sequence row. With WithTenant, on the message's
		// tenant's Middleware.
		r.serial.Do(m.OrderKey, func() {
			outcome, err = r.c.Process(tctx, r.mw, msg, m, func(ctx context.Context, tx *sql.Tx) error {
				return r.h(ctx, tx, msg)
			})
		})
	}
	end(outcome, err)
	if err != nil {
		return r.settle(ctx, msg, m, err)
	}
	t := adapter.EventApplied
	if outcome == idempotent.Duplicate {
		t = adapter.EventDuplicate
	}
	r.observe(ctx, adapter.Event{Type: t, Message: m, Attempt: 1}, msg)
	return nil
}

// settle turns err, the answer for m, into what the handler returns,
// through the one settle rule, and reports it.
func (r *run) settle(ctx context.Context, msg *message.Message, m idempotent.Message, err error) error {
	d := r.rule.Settle(m, err, 1)
	if d.Action == adapter.DeadLetter {
		if !adapter.IsPoison(err) {
			err = adapter.Poison(err)
		}
		r.observe(ctx, adapter.Event{Type: adapter.EventDeadLettered, Message: m, Err: err}, msg)
		return err
	}
	r.observe(ctx, adapter.Event{Type: adapter.EventRequeued, Message: m, Attempt: 1, Delay: d.Delay, Err: err}, msg)
	return &RequeueError{Delay: d.Delay, Err: err}
}

// observe tells the Observer of e for msg.
func (r *run) observe(ctx context.Context, e adapter.Event, msg *message.Message) {
	if r.obs == nil {
		return
	}
	e.Source = source(ctx, msg)
	e.Detail = msg
	r.obs.Observe(ctx, e)
}

// source names where msg came from, for Event.Source: the router's topic,
// where the router set it, and the UUID.
func source(ctx context.Context, msg *message.Message) string {
	if topic := message.SubscribeTopicFromCtx(ctx); topic != "" {
		return "topic " + topic + ", message " + msg.UUID
	}
	return "message " + msg.UUID
}

// inSubscriberTx claims m in the subscriber's transaction and runs the
// handler in it when the claim is new.
func (r *run) inSubscriberTx(ctx context.Context, msg *message.Message, m idempotent.Message) (idempotent.Outcome, error) {
	tx, ok := r.c.subscriberTx(ctx)
	if !ok || tx == nil {
		return 0, fmt.Errorf("%w: message %s", ErrNoTransaction, msg.UUID)
	}
	// The subscriber may keep its transaction across a nack (watermill-sql
	// resends a nacked message in the same transaction, and shares one
	// transaction among a batch of messages): a savepoint makes each
	// call's claim and effect roll back together, leaving the transaction
	// usable and the message not marked seen.
	if _, err := tx.ExecContext(ctx, "SAVEPOINT "+savepoint); err != nil {
		return 0, fmt.Errorf("watermill: message %q: savepoint: %w", m.Key, err)
	}
	outcome := idempotent.Duplicate
	err := func() error {
		claimed, err := r.mw.ClaimMessage(ctx, tx, m)
		if err != nil || !claimed {
			return err
		}
		outcome = idempotent.Applied
		return r.h(ctx, tx, msg)
	}()
	if err != nil {
		if _, rerr := tx.ExecContext(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT "+savepoint); rerr != nil {
			return 0, fmt.Errorf("watermill: message %q: %w (and rolling back to the savepoint: %w)", m.Key, err, rerr)
		}
		return 0, err
	}
	if _, err := tx.ExecContext(ctx, "RELEASE SAVEPOINT "+savepoint); err != nil {
		return 0, fmt.Errorf("watermill: message %q: release savepoint: %w", m.Key, err)
	}
	return outcome, nil
}

// savepoint names the savepoint of a call in a subscriber's transaction.
const savepoint = "idempotent_watermill"
