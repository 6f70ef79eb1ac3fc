package mqtt

import (
	"context"
	"database/sql"

	"github.com/eclipse/paho.golang/paho"

	"github.com/txclaim/idempotent/adapter"
)

// A Handler applies one message's effect through tx, the transaction that
// claimed the message's key. The Consumer runs it only when the claim is
// new — a message applied before is a Duplicate and acknowledged without it
// — and commits the claim and the effect together when it returns nil. It
// must do all its database work through tx with ctx, and must not
// acknowledge msg: the Consumer sends its PUBACK (QoS 1) or PUBREC (QoS 2)
// once the transaction has committed. An error rolls both back and is
// settled by adapter.Rule.Settle: dead-lettered when it is poison (mark it
// with adapter.Poison), run again after a delay otherwise.
type Handler func(ctx context.Context, tx *sql.Tx, msg *paho.Publish) error

// A BatchHandler applies the effects of the fresh messages of one batch —
// those whose claims are new, in their order in the batch — through tx,
// the one transaction that claimed them all. Like a Handler it must not
// acknowledge the messages itself. An error rolls the whole batch back; to
// dead-letter one message alone and have the rest run again without it,
// return adapter.PoisonItem(i, err), i being its index in msgs.
type BatchHandler func(ctx context.Context, tx *sql.Tx, msgs []*paho.Publish) error

// Decode returns a Handler that decodes each message's payload into an M
// with decode and runs h with it. A decode error (wrapped with
// adapter.ErrUndecodable unless it matches it already) makes the message
// poison; since the Handler runs inside the claim's transaction, nothing
// of it is written. [JSON] is a ready-made decode function. Decode panics
// if decode or h is nil.
func Decode[M any](decode func(payload []byte) (M, error), h func(ctx context.Context, tx *sql.Tx, m M, msg *paho.Publish) error) Handler {
	return adapter.DecodeHandler(func(msg *paho.Publish) []byte { return msg.Payload },
		func(msg *paho.Publish) string { return "mqtt: " + msg.Topic }, decode, h)
}

// JSON decodes a JSON payload into an M, for use with Decode. Fields of the
// payload that M does not have are ignored, so producers can add fields
// without breaking consumers. An error matches adapter.ErrUndecodable.
func JSON[M any](payload []byte) (M, error) { return adapter.JSON[M](payload) }
