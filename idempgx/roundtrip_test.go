package idempgx_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// roundTrip returns the median time of a SELECT 1 on one connection to d.
func roundTrip(b testing.TB, d string) time.Duration {
	b.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, d)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(ctx)
	ts := make([]time.Duration, 21)
	for i := range ts {
		start := time.Now()
		if _, err := c.Exec(ctx, "select 1"); err != nil {
			b.Fatal(err)
		}
		ts[i] = time.Since(start)
	}
	slices.Sort(ts)
	return ts[len(ts)/2]
}
