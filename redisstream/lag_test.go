package redisstream_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/txclaim/idempotent/redisstream"
)

// TestLagCountsWhatTheGroupHasNotRead: five entries, a group that read
// two of them, lags three; another group, five; a missing group is an
// error.
func TestLagCountsWhatTheGroupHasNotRead(t *testing.T) {
	ctx := context.Background()
	rdb := newClient(t, redisAddr())
	stream := newStream(t, rdb, "shipping")
	if err := rdb.XGroupCreate(ctx, stream, "billing", "0").Err(); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"v": "1"}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "shipping", Consumer: "c", Streams: []string{stream, ">"}, Count: 2}).Err(); err != nil {
		t.Fatal(err)
	}
	for group, want := range map[string]int64{"shipping": 3, "billing": 5} {
		r, err := redisstream.Lag(rdb, stream, group)
		if err != nil {
			t.Fatal(err)
		}
		lags, err := r.Lag(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(lags) != 1 || lags[0].Messages != want || lags[0].System != "redis" || lags[0].Destination != stream || lags[0].Group != group {
			t.Errorf("group %s: %+v, want %d messages of stream %s", group, lags, want, stream)
		}
	}
	r, err := redisstream.Lag(rdb, stream, "nobody")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Lag(ctx); err == nil {
		t.Error("lag of a missing group: no error")
	}
	if _, err := redisstream.Lag(nil, stream, "shipping"); err == nil {
		t.Error("nil client: no error")
	}
}
