package dialecttest

import (
	"context"
	"database/sql"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
)

// checkSeenTablesApart: two middlewares of one consumer name on two tables,
// sharing one in-process pre-check (as SeenLRU's doc suggests), apply each
// message once in each table — the pre-check never answers for the other
// table — and their redeliveries are duplicates.
func checkSeenTablesApart(t *testing.T, e *Env) {
	ctx := testContext(t)
	db := e.DB(t)
	lru, err := idempotent.NewSeenLRU(100)
	if err != nil {
		t.Fatal(err)
	}
	tables := []string{e.Table(t, db), e.Table(t, db)}
	var mws []*idempotent.Middleware
	var fxs []*Effects
	for _, table := range tables {
		mws = append(mws, e.Middleware(t, db, table, "conformance", idempotent.WithSeen(lru)))
		fxs = append(fxs, e.NewEffects(t, db, table, 3))
	}
	batch := []string{"b", "c"}
	for round, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
		for i, mw := range mws {
			fx := fxs[i]
			out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "a"}, func(ctx context.Context, tx *sql.Tx) error { return fx.Bump(ctx, tx, 1) })
			if err != nil || out != want {
				t.Fatalf("round %d, table %s: ProcessMessage = %v, %v; want %v", round+1, tables[i], out, err, want)
			}
			outs, err := mw.ProcessMessages(ctx, keyMessages(batch...), func(ctx context.Context, tx *sql.Tx, fresh []int) error {
				for _, j := range fresh {
					if err := fx.Bump(ctx, tx, 2+j); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil || !slices.Equal(outs, []idempotent.Outcome{want, want}) {
				t.Fatalf("round %d, table %s: ProcessMessages = %v, %v; want two %v", round+1, tables[i], outs, err, want)
			}
		}
	}
	for i, table := range tables {
		for id := 1; id <= 3; id++ {
			if n := fxs[i].Get(t, id); n != 1 {
				t.Errorf("table %s: effect %d applied %d times, want once", table, id, n)
			}
		}
		if got := e.Claims(t, db, table); len(got) != 3 {
			t.Errorf("table %s: claims %q, want a, b and c", table, got)
		}
	}
}

// countingSeen counts the hits of a pre-check.
type countingSeen struct {
	inner idempotent.Seen
	hits  atomic.Int32
}

func (c *countingSeen) Seen(ctx context.Context, scope idempotent.SeenScope, key string) bool {
	ok := c.inner.Seen(ctx, scope, key)
	if ok {
		c.hits.Add(1)
	}
	return ok
}

func (c *countingSeen) Record(ctx context.Context, scope idempotent.SeenScope, key string, ttl time.Duration) {
	c.inner.Record(ctx, scope, key, ttl)
}

// checkIdentifier: the dialect names the claim table's database on the
// real server, the same from two pools, so the pre-check runs: a
// redelivery is answered by it.
func checkIdentifier(t *testing.T, e *Env) {
	id, ok := e.h.Dialect.(dialect.Identifier)
	if !ok {
		t.Skipf("the %s dialect does not implement dialect.Identifier", e.h.Dialect.Name())
	}
	ctx := testContext(t)
	db := e.DB(t)
	table := e.Table(t, db)
	lru, err := idempotent.NewSeenLRU(100)
	if err != nil {
		t.Fatal(err)
	}
	seen := &countingSeen{inner: lru}
	mw := e.Middleware(t, db, table, "conformance", idempotent.WithSeen(seen))
	scope, err := mw.SeenScope(ctx)
	if err != nil || scope.Database == "" || scope.Table != table || scope.Consumer != "conformance" {
		t.Fatalf("SeenScope = %+v, %v; want the database named, table %s, consumer conformance", scope, err, table)
	}
	t.Logf("identity: %s", scope.Database)
	other, err := idempotent.New(e.DB(t), e.h.Dialect, "conformance", idempotent.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if s, err := other.SeenScope(ctx); err != nil || s != scope {
		t.Fatalf("another pool: SeenScope = %+v, %v; want %+v", s, err, scope)
	}
	parsed, err := dialect.ParseTable(table)
	if err != nil {
		t.Fatal(err)
	}
	name, err := id.Identity(ctx, parsed, func(ctx context.Context, query string, args ...any) (string, error) {
		var s sql.NullString
		err := db.QueryRowContext(ctx, query, args...).Scan(&s)
		return s.String, err
	})
	if err != nil || name != scope.Database {
		t.Fatalf("Identity = %q, %v; want %q", name, err, scope.Database)
	}
	noop := func(context.Context, *sql.Tx) error { return nil }
	if out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "k"}, noop); err != nil || out != idempotent.Applied {
		t.Fatalf("ProcessMessage = %v, %v; want applied", out, err)
	}
	if out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: "k"}, noop); err != nil || out != idempotent.Duplicate || seen.hits.Load() != 1 {
		t.Fatalf("redelivery = %v, %v with %d pre-check hits; want a duplicate from the pre-check", out, err, seen.hits.Load())
	}
}
