package rabbitmq

import (
	"context"
	"database/sql"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent/adapter"
)

// A Handler applies one delivery's effect. The Consumer runs it only for a
// delivery whose claim is new, inside the claim's transaction: it must do
// all its work through tx, with ctx, and must not commit or roll back tx.
// A nil return commits the claim and the effect together, and the delivery
// is acked; an error rolls both back, and the delivery is settled by the
// one settle rule, adapter.Rule.Settle: poison (adapter.Poison,
// adapter.ErrUndecodable, a WithPoison predicate) is dead-lettered,
// anything else requeued after the retry delay. It must not ack, nack or
// reject the delivery.
type Handler func(ctx context.Context, tx *sql.Tx, d *amqp.Delivery) error

// A BatchHandler applies the effects of a batch's fresh deliveries — those
// whose claims were new, in the order they arrived — in the one
// transaction that claimed the whole batch (see NewBatchConsumer). A nil
// return commits every claim and effect of the batch; an error rolls them
// all back. To set one delivery aside, return adapter.PoisonItem(i, err)
// with its index i in ds: the Consumer dead-letters it alone and runs the
// rest of the batch again without it.
type BatchHandler func(ctx context.Context, tx *sql.Tx, ds []*amqp.Delivery) error

// Decode returns a Handler that decodes each delivery's body into an M with
// decode and passes it to h with the delivery. It decodes inside the
// claim's transaction, so a duplicate is never decoded; a decode error
// (wrapped with adapter.ErrUndecodable unless it matches it already) rolls
// the claim back and dead-letters the delivery. [JSON] is a ready-made
// decode function. Decode panics if decode or h is nil.
func Decode[M any](decode func(payload []byte) (M, error), h func(ctx context.Context, tx *sql.Tx, m M, d *amqp.Delivery) error) Handler {
	return adapter.DecodeHandler(func(d *amqp.Delivery) []byte { return d.Body },
		func(*amqp.Delivery) string { return "rabbitmq: decode the body" }, decode, h)
}

// JSON decodes a JSON body into an M, for use with Decode. Fields of the
// body that M does not have are ignored, so producers can add fields
// without breaking consumers; data after the JSON value is an error. Its
// errors match adapter.ErrUndecodable.
func JSON[M any](payload []byte) (M, error) { return adapter.JSON[M](payload) }
