package redisstream

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/txclaim/idempotent/adapter"
)

// Lag returns a LagReporter of consumer group group on stream (for
// otelmetrics.ConsumerLag): the entries the group has yet to read, as
// XINFO GROUPS reports them (Redis 7.0 or later). When Redis cannot tell —
// after entries were deleted from the middle of the stream — it is an
// error naming the group, and nothing is reported for it.
func Lag(client redis.UniversalClient, stream, group string) (adapter.LagReporter, error) {
	switch {
	case client == nil:
		return nil, errors.New("redisstream: Lag: nil client")
	case stream == "" || group == "":
		return nil, errors.New("redisstream: Lag: empty stream or group name")
	}
	return adapter.LagFunc(func(ctx context.Context) ([]adapter.Lag, error) {
		groups, err := client.XInfoGroups(ctx, stream).Result()
		if err != nil {
			return nil, fmt.Errorf("redisstream: lag of group %q on stream %q: %w", group, stream, err)
		}
		for _, g := range groups {
			if g.Name != group {
				continue
			}
			if g.Lag < 0 {
				return nil, fmt.Errorf("redisstream: lag of group %q on stream %q: Redis cannot tell (entries were deleted from the stream)", group, stream)
			}
			return []adapter.Lag{{System: "redis", Group: group, Destination: stream, Messages: g.Lag}}, nil
		}
		return nil, fmt.Errorf("redisstream: lag of group %q on stream %q: no such group", group, stream)
	}), nil
}
