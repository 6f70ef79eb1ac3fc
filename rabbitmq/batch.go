package rabbitmq

import (
	"context"
	"database/sql"
	"errors"
	"slices"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
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
	done := make([]result, 0, len(ds))
	live := make([]result, 0, len(ds))
	for _, d := range ds {
		msg, err := c.cfg.Message(d)
		if err == nil {
			err = c.mw.CheckMessage(msg)
		}
		if err != nil {
			done = append(done, result{d: d, msg: msg, err: err})
			continue
		}
		live = append(live, result{d: d, msg: msg})
	}
	for len(live) > 0 {
		msgs := make([]idempotent.Message, len(live))
		for i, x := range live {
			msgs[i] = x.msg
		}
		aside := -1 // the index in live of the delivery the handler set aside
		outs, err := c.mw.ProcessMessages(ctx, msgs, func(ctx context.Context, tx *sql.Tx, fresh []int) error {
			aside = -1
			batch := make([]*amqp.Delivery, len(fresh))
			for k, i := range fresh {
				batch[k] = live[i].d
			}
			err := c.bh(ctx, tx, batch)
			var ie *adapter.ItemError
			if errors.As(err, &ie) && ie.Index >= 0 && ie.Index < len(fresh) {
				aside = fresh[ie.Index]
			}
			return err
		})
		if err == nil {
			for i := range live {
				live[i].out = outs[i]
			}
			done = append(done, live...)
			break
		}
		var ke *idempotent.BatchKeyError
		switch {
		case aside >= 0 && errors.As(err, new(*adapter.ItemError)):
		case errors.As(err, &ke) && ke.Index >= 0 && ke.Index < len(live):
			aside = ke.Index
		default:
			for i := range live {
				live[i].err = err
			}
			done = append(done, live...)
			live = nil
			continue
		}
		live[aside].err = err
		done = append(done, live[aside])
		live = slices.Delete(live, aside, aside+1)
	}
	c.settle(ctx, r, done)
}
