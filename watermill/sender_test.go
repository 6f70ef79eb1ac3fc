package watermill_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
	idwm "github.com/txclaim/idempotent/watermill"
)

// publisher records what it is given.
type publisher struct{ msgs []*message.Message }

func (p *publisher) Publish(_ string, msgs ...*message.Message) error {
	p.msgs = append(p.msgs, msgs...)
	return nil
}

func (p *publisher) Close() error { return nil }

// TestSenderCarriesTheEventTime: a row enqueued with an event time is
// published with it in adapter.EventTimeHeader, over whatever the stored
// metadata says; a row without one keeps the stored field, or else gets
// the row's creation time. UUID and KeyMetadata are the row's key.
func TestSenderCarriesTheEventTime(t *testing.T) {
	t.Parallel()
	at := time.Date(2031, 3, 14, 23, 30, 0, 0, time.UTC)
	created := time.Date(2031, 3, 15, 0, 30, 0, 0, time.UTC)
	stored := time.Date(2031, 3, 13, 8, 0, 0, 0, time.UTC)
	row := func(md map[string]string, eventTime time.Time) outbox.Message {
		b, err := json.Marshal(map[string]any{"metadata": md, "payload": []byte(`{"points": 100}`)})
		if err != nil {
			t.Fatal(err)
		}
		return outbox.Message{ID: 1, IdempotencyKey: "row-key", Payload: b, EventTime: eventTime, CreatedAt: created}
	}
	for _, tc := range []struct {
		name string
		m    outbox.Message
		want time.Time
	}{
		{"the row's event time", row(nil, at), at},
		{"the row's event time over the stored field", row(map[string]string{adapter.EventTimeHeader: adapter.FormatEventTime(stored)}, at), at},
		{"the stored field", row(map[string]string{adapter.EventTimeHeader: adapter.FormatEventTime(stored)}, time.Time{}), stored},
		{"the row's creation", row(nil, time.Time{}), created},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p publisher
			if err := idwm.NewSender(&p, "points").Send(context.Background(), tc.m); err != nil {
				t.Fatal(err)
			}
			if len(p.msgs) != 1 {
				t.Fatalf("%d messages published, want 1", len(p.msgs))
			}
			got := p.msgs[0]
			if v := got.Metadata.Get(adapter.EventTimeHeader); v != adapter.FormatEventTime(tc.want) {
				t.Errorf("%s = %q, want %q", adapter.EventTimeHeader, v, adapter.FormatEventTime(tc.want))
			}
			if got.UUID != "row-key" || got.Metadata.Get(idwm.KeyMetadata) != "row-key" || string(got.Payload) != `{"points": 100}` {
				t.Errorf("published %s (%s) %s, want the row's key and payload", got.UUID, got.Metadata.Get(idwm.KeyMetadata), got.Payload)
			}
		})
	}
	var p publisher
	err := idwm.NewSender(&p, "points").Send(context.Background(), outbox.Message{ID: 2, Payload: []byte(`"not an envelope"`)})
	if !errors.Is(err, outbox.ErrPermanent) || len(p.msgs) != 0 {
		t.Fatalf("a row that is not an envelope: %v, %d published; want a permanent failure, none", err, len(p.msgs))
	}
}

// TestSenderCarriesTheOrder: a row enqueued with outbox.WithOrder is
// published with its ordering key and sequence in adapter.OrderKeyHeader
// and adapter.OrderSeqHeader.
func TestSenderCarriesTheOrder(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(map[string]any{"payload": []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	var p publisher
	if err := idwm.NewSender(&p, "ledger").Send(context.Background(), outbox.Message{ID: 1, IdempotencyKey: "k", Payload: b, OrderKey: "account:42", OrderSeq: 7}); err != nil {
		t.Fatal(err)
	}
	md := p.msgs[0].Metadata
	if key, seq, err := adapter.ParseOrder(md.Get(adapter.OrderKeyHeader), md.Get(adapter.OrderSeqHeader)); err != nil || key != "account:42" || seq != 7 {
		t.Errorf("metadata %v: %q, %d, %v", md, key, seq, err)
	}
}
