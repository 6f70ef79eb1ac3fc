package deadletter

import (
	"context"
	"fmt"
	"strings"
)

// Count is how many dead letters wait in the outbox for one consumer,
// kind and source.
type Count struct {
	// Consumer is the consumer name of the outbox that wrote them.
	Consumer string
	// Kind is their outbox kind (KafkaKind, RedisStreamKind…).
	Kind string
	// Source is the topic or stream the poison messages came from; "" when
	// their payload names none (the Go CDK's).
	Source string
	// N is how many there are.
	N int64
}

// Counts returns how many dead letters of the Store's kinds the outbox
// holds, by consumer, kind and source, in that order: what a dashboard
// shows (package otelmetrics reports it as a gauge) and an alert watches.
func (s *Store) Counts(ctx context.Context) ([]Count, error) {
	rows, err := s.db.QueryContext(ctx, s.q.counts, strings.Join(s.kinds, ","))
	if err != nil {
		return nil, fmt.Errorf("deadletter: count %s: %w", s.table, s.tableErr(err))
	}
	defer rows.Close()
	var out []Count
	for rows.Next() {
		var c Count
		if err := rows.Scan(&c.Consumer, &c.Kind, &c.Source, &c.N); err != nil {
			return nil, fmt.Errorf("deadletter: count %s: %w", s.table, err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("deadletter: count %s: %w", s.table, err)
	}
	return out, nil
}
