package adapter

import (
	"context"
	"database/sql"
	"errors"

	"github.com/txclaim/idempotent"
)

// Result is how one delivery of a batch ended: the Middleware's outcome,
// or the error to settle the delivery by (Rule.Settle).
type Result struct {
	Outcome idempotent.Outcome
	Err     error
}

// ProcessBatch is the batch loop every adapter's batch consumer runs, so
// that each delivery of a batch is settled on its own. ds are the batch's
// deliveries, msgs[i] the Message read from ds[i] (Config.Message) and
// errs[i] the error reading it (errs may be nil). A delivery with an
// error, or one mw.CheckMessage refuses, is set aside before any
// transaction. The rest are claimed in one transaction
// (Middleware.ProcessMessages), and h runs in it with the deliveries whose
// claims were new, in their order in ds. A delivery h names with
// PoisonItem (its index in h's slice), or the Middleware with an
// *idempotent.BatchKeyError, is set aside with that error and the rest run
// again without it — nothing had committed, so running them again is
// safe; any other error becomes every remaining delivery's, as does
// any error once ctx has ended. ProcessBatch returns each delivery's
// Result, in the order of ds.
func ProcessBatch[T any](ctx context.Context, mw *idempotent.Middleware, ds []T, msgs []idempotent.Message, errs []error, h func(ctx context.Context, tx *sql.Tx, fresh []T) error) []Result {
	res := make([]Result, len(ds))
	var live []int // the indexes in ds of the deliveries to claim
	for i := range ds {
		var err error
		if errs != nil {
			err = errs[i]
		}
		if err == nil {
			err = mw.CheckMessage(msgs[i])
		}
		if err != nil {
			res[i].Err = err
			continue
		}
		live = append(live, i)
	}
	for len(live) > 0 {
		claims := make([]idempotent.Message, len(live))
		for j, i := range live {
			claims[j] = msgs[i]
		}
		var given []int // the indexes in ds of the deliveries h was given
		outs, err := mw.ProcessMessages(ctx, claims, func(ctx context.Context, tx *sql.Tx, fresh []int) error {
			given = given[:0]
			sel := make([]T, len(fresh))
			for j, k := range fresh {
				given = append(given, live[k])
				sel[j] = ds[live[k]]
			}
			return h(ctx, tx, sel)
		})
		if err == nil {
			for j, i := range live {
				res[i].Outcome = outs[j]
			}
			break
		}
		if i, ok := culprit(err, live, given); ok && ctx.Err() == nil {
			res[i].Err = err
			live = without(live, i)
			continue
		}
		for _, i := range live {
			res[i].Err = err
		}
		break
	}
	return res
}

// culprit returns the index in ds of the one delivery err blames: the
// handler's ItemError (an index into given) or the Middleware's
// idempotent.BatchKeyError (an index into live).
func culprit(err error, live, given []int) (int, bool) {
	if ie := (*ItemError)(nil); errors.As(err, &ie) {
		if ie.Index >= 0 && ie.Index < len(given) {
			return given[ie.Index], true
		}
		return 0, false
	}
	if ke := (*idempotent.BatchKeyError)(nil); errors.As(err, &ke) {
		if ke.Index >= 0 && ke.Index < len(live) {
			return live[ke.Index], true
		}
	}
	return 0, false
}

// without returns s without the value v.
func without(s []int, v int) []int {
	out := make([]int, 0, len(s))
	for _, x := range s {
		if x != v {
			out = append(out, x)
		}
	}
	return out
}
