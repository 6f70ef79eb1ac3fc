package idempgx_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idempgx"
)

type order struct{ id string }

func orderMessage(o order) (idempotent.Message, error) {
	if o.id == "" {
		return idempotent.Message{}, errors.New("no order id")
	}
	return idempotent.Message{Key: "order-" + o.id}, nil
}

func TestWrapMessages(t *testing.T) {
	t.Parallel()
	p, s, m := setup(t, 2)
	ctx := context.Background()
	var got [][]order
	handle := idempgx.WrapMessages(m, orderMessage, func(ctx context.Context, tx pgx.Tx, os []order) error {
		got = append(got, os)
		for _, o := range os {
			if _, err := tx.Exec(ctx, "INSERT INTO "+s+".effects (id) VALUES ($1)", o.id); err != nil {
				return err
			}
		}
		return nil
	})
	outs, err := handle(ctx, []order{{"2"}, {"1"}, {"2"}})
	if want := []idempotent.Outcome{idempotent.Applied, idempotent.Applied, idempotent.Duplicate}; err != nil || !slices.Equal(outs, want) {
		t.Fatalf("first batch: %v, %v; want %v", outs, err, want)
	}
	outs, err = handle(ctx, []order{{"1"}, {"3"}})
	if want := []idempotent.Outcome{idempotent.Duplicate, idempotent.Applied}; err != nil || !slices.Equal(outs, want) {
		t.Fatalf("second batch: %v, %v; want %v", outs, err, want)
	}
	if len(got) != 2 || !slices.Equal(got[0], []order{{"2"}, {"1"}}) || !slices.Equal(got[1], []order{{"3"}}) {
		t.Fatalf("the handler got %v, want the new orders of each batch in batch order", got)
	}
	if n := count(t, p, "SELECT count(*) FROM "+s+".effects"); n != 3 {
		t.Fatalf("%d effects, want 3", n)
	}
	_, err = handle(ctx, []order{{"4"}, {""}})
	var bke *idempotent.BatchKeyError
	if !errors.As(err, &bke) || bke.Index != 1 || !errors.Is(err, idempotent.ErrInvalidKey) {
		t.Fatalf("a message without an id: %v, want a BatchKeyError for message 1 matching ErrInvalidKey", err)
	}
	if _, err := handle(ctx, make([]order, idempotent.MaxBatchSize+1)); !errors.Is(err, idempotent.ErrBatchTooLarge) {
		t.Fatalf("too large a batch: %v, want ErrBatchTooLarge", err)
	}
	if outs, err := handle(ctx, nil); outs != nil || err != nil {
		t.Fatalf("an empty batch: %v, %v", outs, err)
	}
	if _, err := idempgx.WrapMessages[order](m, orderMessage, nil)(ctx, []order{{"5"}}); err == nil {
		t.Fatal("a nil handler accepted")
	}
}

func TestWrapMessage(t *testing.T) {
	t.Parallel()
	_, s, m := setup(t, 2)
	ctx := context.Background()
	handle := idempgx.WrapMessage(m, orderMessage, func(ctx context.Context, tx pgx.Tx, o order) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+s+".effects (id) VALUES ($1)", o.id)
		return err
	})
	for _, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
		if got, err := handle(ctx, order{"1"}); err != nil || got != want {
			t.Fatalf("%v, %v; want %v", got, err, want)
		}
	}
	if _, err := handle(ctx, order{}); !errors.Is(err, idempotent.ErrInvalidKey) {
		t.Fatalf("a message without an id: %v, want ErrInvalidKey", err)
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	_, s, m := setup(t, 1, idempgx.WithLockTimeout(2*time.Second), idempgx.WithRetention(48*time.Hour), idempgx.WithDailyPartitions(2))
	cfg := m.Config()
	if cfg.Consumer != "orders" || cfg.Table != s+".claims" || cfg.Table != m.Core().ClaimTable().Name() || cfg.Dialect.Name() != "postgres" ||
		cfg.LockTimeout != 2*time.Second || cfg.Retention != 48*time.Hour || !cfg.Partitioned() || cfg.StrictGuard {
		t.Fatalf("Config() = %+v", cfg)
	}
}
