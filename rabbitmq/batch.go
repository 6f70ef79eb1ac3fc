package rabbitmq

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
)

// batches is a batch consumer's worker: it takes a delivery, adds those
// already received up to the batch size without waiting for more, and
// runs them as one batch.
func (c *Consumer) batches(ctx context.Context, r *run, deliveries <-chan amqp.Delivery) {
	for d := range deliveries {
		batch := []*amqp.Delivery{&d}
	fill:
		for len(batch) < c.cfg.batchSize {
			select {
			case next, ok := <-deliveries:
				if !ok {
					break fill
				}
				batch = append(batch, &next)
			default:
				break fill
			}
		}
		c.workBatch(ctx, r, batch)
	}
}

// workBatch claims a batch in one transaction and settles each delivery
// on its own. A delivery the Middleware would refuse before any
// transaction, or one the handler sets aside, is settled alone and the
// rest claimed again without it.
func (c *Consumer) workBatch(ctx context.Context, r *run, ds []*amqp.Delivery) {
	if r.stopped() {
		for _, d := range ds {
			c.release(ctx, r, d)
		}
		return
	}
	msgs := make([]idempotent.Message, len(ds))
	errs := make([]error, len(ds))
	for i, d := range ds {
		msgs[i], errs[i] = c.cfg.Message(d)
	}
	tctx, end := c.cfg.StartBatchTrace(ctx, ds, msgs)
	res := c.cfg.ProcessBatch(tctx, c.mw, ds, msgs, errs, c.bh)
	end(res)
	done := make([]result, len(ds))
	for i, d := range ds {
		done[i] = result{d: d, msg: msgs[i], out: res[i].Outcome, err: res[i].Err}
	}
	c.settle(ctx, r, done)
}
