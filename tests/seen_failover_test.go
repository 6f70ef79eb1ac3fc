package tests

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
)

// TestSeenAfterFailover: what a failover means for the pre-check (issue 20,
// "a pre-check can skip work only where a wrong answer is harmless"). A
// message applied on the primary after the replication link was cut is
// lost with it when the standby is promoted. Its redelivery (its ack never
// reached the broker, say) must apply again on the new primary: a process
// started after the failover reads the database's name afresh — a new
// timeline — and the pre-check it shares with the old one (one shared
// store) does not answer for the claim the old primary took with it.
func TestSeenAfterFailover(t *testing.T) {
	p := newReplicationPair(t)
	ctx := context.Background()
	lru, err := idempotent.NewSeenLRU(100)
	if err != nil {
		t.Fatal(err)
	}
	newConsumer := func(db *sql.DB) *idempotent.Middleware {
		t.Helper()
		m, err := idempotent.New(db, postgres.New(), "orders", idempotent.WithSeen(lru))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	effect := func(k string) idempotent.TxFunc {
		return func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO effects (id, n) VALUES ($1, 1) ON CONFLICT (id) DO UPDATE SET n = effects.n + 1", k)
			return err
		}
	}
	primary := p.open(t, p.primary.DSN("seen-primary"))
	standby := p.open(t, p.standby.DSN("seen-standby"))
	if _, err := primary.Exec("CREATE TABLE effects (id text PRIMARY KEY, n int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	before := newConsumer(primary)
	if err := before.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if out, err := before.ProcessMessage(ctx, idempotent.Message{Key: "kept"}, effect("kept")); err != nil || out != idempotent.Applied {
		t.Fatalf("kept: %v, %v; want applied", out, err)
	}
	waitFor(t, "the standby to replay the claim of kept", func() (bool, error) {
		var n int
		err := standby.QueryRow("SELECT count(*) FROM processed_messages WHERE message_key = 'kept'").Scan(&n)
		if err != nil && strings.Contains(err.Error(), "does not exist") {
			return false, nil
		}
		return n == 1, err
	})
	p.link.Cut()
	if out, err := before.ProcessMessage(ctx, idempotent.Message{Key: "lost"}, effect("lost")); err != nil || out != idempotent.Applied {
		t.Fatalf("lost: %v, %v; want applied (on the primary alone)", out, err)
	}
	if err := p.primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := p.standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}

	after := newConsumer(standby)
	if out, err := after.ProcessMessage(ctx, idempotent.Message{Key: "lost"}, effect("lost")); err != nil || out != idempotent.Applied {
		t.Errorf("the redelivery of lost after the failover: %v, %v; want applied again (its claim went with the old primary)", out, err)
	}
	if out, err := after.ProcessMessage(ctx, idempotent.Message{Key: "kept"}, effect("kept")); err != nil || out != idempotent.Duplicate {
		t.Errorf("the redelivery of kept after the failover: %v, %v; want duplicate (its claim was replicated)", out, err)
	}
	for _, k := range []string{"kept", "lost"} {
		var n int
		if err := standby.QueryRow("SELECT coalesce((SELECT n FROM effects WHERE id = $1), 0)", k).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("%s: effect applied %d times on the new primary, want once", k, n)
		}
	}

	// The new primary has the cluster's system identifier and a new
	// timeline: another scope.
	sb, errB := before.SeenScope(ctx)
	sa, errA := after.SeenScope(ctx)
	t.Logf("before: %s\nafter:  %s", sb.Database, sa.Database)
	fb, fa := strings.Fields(sb.Database), strings.Fields(sa.Database)
	if errB != nil || errA != nil || len(fb) < 5 || len(fa) < 5 || fb[2] != fa[2] || fb[4] == fa[4] {
		t.Errorf("scopes %q (%v) and %q (%v): want one system identifier and two timelines", sb.Database, errB, sa.Database, errA)
	}
}
