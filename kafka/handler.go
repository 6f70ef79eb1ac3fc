package kafka

import (
	"context"
	"database/sql"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent/adapter"
)

// A Handler applies one record's effect inside the transaction that claimed
// its key and advances its partition's offset. It runs only when the claim
// is new. It must do all its database work through tx, with ctx, and must
// not commit or roll back tx. An error rolls back claim, effect and offset
// together: a poison error (matching adapter.ErrPoison, see adapter.Poison
// and WithPoison) dead-letters the record, any other error retries it in
// place.
type Handler func(ctx context.Context, tx *sql.Tx, r *kgo.Record) error

// A BatchHandler applies, set-wise, the effects of the records of one
// batch of a partition (see WithBatchSize) whose claims were new, given in
// offset order, inside the one transaction that claimed them and advances
// the partition's offset past them all. The same rules as for Handler
// apply. To dead-letter one poison record of the batch, return
// adapter.PoisonItem(i, err), i its index in rs: the Consumer runs the
// batch again without it. Any other poison error cannot name its record:
// the Consumer then runs the batch's records one at a time (each with a
// one-record slice), so that only the poison one is dead-lettered.
type BatchHandler func(ctx context.Context, tx *sql.Tx, rs []*kgo.Record) error

// Decode returns a Handler that decodes each record's value into an M with
// decode and applies h's effect for it, with the record for its headers
// and position. A decode error, wrapped with adapter.ErrUndecodable unless
// it matches it, makes the record poison. [JSON] is a ready-made decode
// function. Decode panics if an argument is nil.
func Decode[M any](decode func(payload []byte) (M, error), h func(ctx context.Context, tx *sql.Tx, m M, r *kgo.Record) error) Handler {
	return adapter.DecodeHandler(func(r *kgo.Record) []byte { return r.Value },
		func(r *kgo.Record) string { return "kafka: " + position(r) }, decode, h)
}

// JSON decodes a JSON value into an M, for use with Decode. Fields of the
// value that M does not have are ignored, so producers can add fields
// without breaking consumers. An error matches adapter.ErrUndecodable.
func JSON[M any](payload []byte) (M, error) { return adapter.JSON[M](payload) }
