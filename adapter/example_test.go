package adapter_test

import (
	"fmt"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

// An adapter settles every delivery through one Rule: here a message dated
// 20 minutes ahead of the clock (past the 5-minute skew margin) waits for
// the clock, one too old is poison, and an applied one is acked.
func ExampleRule_Settle() {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	rule := adapter.Rule{Now: func() time.Time { return now }}
	ahead := idempotent.Message{Key: "order-completed:9912", EventTime: now.Add(20 * time.Minute)}
	d := rule.Settle(ahead, idempotent.ErrInvalidEventTime, 1)
	fmt.Println(d.Action, d.Delay)
	fmt.Println(rule.Settle(idempotent.Message{Key: "order-completed:1"}, idempotent.ErrBeyondRetention, 1).Action)
	fmt.Println(rule.Settle(ahead, nil, 1).Action)
	// Output:
	// requeue 15m0s
	// dead-letter
	// ack
}

// A producer sets the event time once, in the header every adapter reads.
func ExampleFormatEventTime() {
	at := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	headers := map[string]string{adapter.EventTimeHeader: adapter.FormatEventTime(at)}
	got, err := adapter.ParseEventTime(headers[adapter.EventTimeHeader])
	fmt.Println(headers[adapter.EventTimeHeader], got.Equal(at), err)
	// Output:
	// 2026-12-01T09:30:00Z true <nil>
}
