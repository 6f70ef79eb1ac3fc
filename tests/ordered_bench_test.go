package tests

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/postgres"
)

// BenchmarkOrderedVsProcess measures, head to head on lib/pq, one worker,
// the cost per message of ProcessMessage ("process"), of WithOrdering for
// messages that arrive in order ("ordered"), and for messages that arrive
// one ahead, park, and are released by their predecessor
// ("parked-released": each pair counts as two messages). Every variant
// runs the same effect, an UPDATE of one of 100 balances.
//
//	go test -run '^$' -bench BenchmarkOrderedVsProcess -benchtime 3000x ./tests/
func BenchmarkOrderedVsProcess(b *testing.B) {
	db := testenv.OpenPostgres(b, 2)
	schema := testenv.LoyaltySchema(b, db, "ordbench")
	effect := func(ctx context.Context, tx *sql.Tx, i int) error {
		_, err := tx.ExecContext(ctx, "UPDATE "+schema+".balances SET points = points + 1 WHERE customer_id = $1", i%100+1)
		return err
	}
	release := func(ctx context.Context, tx *sql.Tx, p idempotent.ParkedMessage) error {
		return effect(ctx, tx, int(p.OrderSeq))
	}
	newMW := func(b *testing.B, table string, opts ...idempotent.Option) *idempotent.Middleware {
		b.Helper()
		opts = append([]idempotent.Option{idempotent.WithTable(schema + "." + table)}, opts...)
		mw, err := idempotent.New(db, postgres.New(), "bench", opts...)
		if err != nil {
			b.Fatal(err)
		}
		if err := mw.EnsureSchema(context.Background()); err != nil {
			b.Fatal(err)
		}
		return mw
	}
	ctx := context.Background()
	const entities = 1000
	b.Run("process", func(b *testing.B) {
		mw := newMW(b, fmt.Sprintf("claims_p%d", b.N))
		for i := range b.N {
			if _, err := mw.ProcessMessage(ctx, idempotent.Message{Key: fmt.Sprintf("m%d", i)}, func(ctx context.Context, tx *sql.Tx) error { return effect(ctx, tx, i) }); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ordered", func(b *testing.B) {
		mw := newMW(b, fmt.Sprintf("claims_o%d", b.N), idempotent.WithOrdering(idempotent.Ordering{Release: release}))
		for i := range b.N {
			msg := idempotent.Message{Key: fmt.Sprintf("m%d", i), OrderKey: fmt.Sprintf("e%d", i%entities), OrderSeq: int64(i/entities + 1)}
			out, err := mw.ProcessMessage(ctx, msg, func(ctx context.Context, tx *sql.Tx) error { return effect(ctx, tx, i) })
			if err != nil || out != idempotent.Applied {
				b.Fatal(out, err)
			}
		}
	})
	b.Run("parked-released", func(b *testing.B) {
		mw := newMW(b, fmt.Sprintf("claims_r%d", b.N), idempotent.WithOrdering(idempotent.Ordering{Release: release}))
		for i := 0; i+1 < b.N; i += 2 {
			entity, seq := fmt.Sprintf("e%d", (i/2)%entities), int64((i/2)/entities*2+1)
			late := idempotent.Message{Key: fmt.Sprintf("m%d", i+1), OrderKey: entity, OrderSeq: seq + 1, Payload: []byte("{}")}
			if out, err := mw.ProcessMessage(ctx, late, func(ctx context.Context, tx *sql.Tx) error { return effect(ctx, tx, i+1) }); err != nil || out != idempotent.Parked {
				b.Fatal(out, err)
			}
			first := idempotent.Message{Key: fmt.Sprintf("m%d", i), OrderKey: entity, OrderSeq: seq}
			if out, err := mw.ProcessMessage(ctx, first, func(ctx context.Context, tx *sql.Tx) error { return effect(ctx, tx, i) }); err != nil || out != idempotent.Applied {
				b.Fatal(out, err)
			}
		}
	})
}
