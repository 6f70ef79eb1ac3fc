package idempgx_test

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idempgx"
)

// TestSeenTablesApart is issue 20's case 3 on the pgx path: two
// Middlewares of one consumer on two tables of one database, sharing one
// SeenLRU, each apply every message in their own table — the pre-check
// never answers for the other table — and their redeliveries are
// duplicates.
func TestSeenTablesApart(t *testing.T) {
	t.Parallel()
	lru, err := idempotent.NewSeenLRU(100)
	if err != nil {
		t.Fatal(err)
	}
	p, s, a := setup(t, 4, idempgx.WithSeen(lru))
	b, err := idempgx.New(p, "orders", idempgx.WithTable(s+".claims_b"), idempgx.WithSeen(lru))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	batch := []string{"m2", "m3"}
	for round, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
		for i, m := range []*idempgx.Middleware{a, b} {
			id := func(k string) string { return string(rune('a'+i)) + k }
			if out, err := m.ProcessMessage(ctx, idempotent.Message{Key: "m1"}, insertEffect(s, id("m1"))); err != nil || out != want {
				t.Errorf("round %d, table %d: ProcessMessage = %v, %v; want %v", round+1, i, out, err, want)
			}
			outs, err := m.ProcessMessages(ctx, keyMessages(batch...), func(ctx context.Context, tx pgx.Tx, fresh []int) error {
				for _, j := range fresh {
					if err := insertEffect(s, id(batch[j]))(ctx, tx); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil || !slices.Equal(outs, []idempotent.Outcome{want, want}) {
				t.Errorf("round %d, table %d: ProcessMessages = %v, %v; want two %v", round+1, i, outs, err, want)
			}
		}
	}
	for _, table := range []string{"claims", "claims_b"} {
		if n := count(t, p, "SELECT count(*) FROM "+s+"."+table); n != 3 {
			t.Errorf("%s: %d claims, want 3", table, n)
		}
	}
	if n := count(t, p, "SELECT count(*) FROM "+s+".effects WHERE n = 1"); n != 6 {
		t.Errorf("%d effects applied once, want 6 (three per table)", n)
	}
	// The pgx Middleware's scope is its core's.
	sa, errA := a.Core().SeenScope(ctx)
	sb, errB := b.Core().SeenScope(ctx)
	if errA != nil || errB != nil || sa == sb || sa.Consumer != "orders" || sa.Table != s+".claims" {
		t.Errorf("scopes %+v (%v) and %+v (%v): want two of consumer orders", sa, errA, sb, errB)
	}
}
