package adapter_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/outbox"
)

// TestDeadMessageReplayHeaders: a send carries the relay's trace context
// and the stored event time in place of the message's own, without the
// headers named to drop, and leaves the dead letter's headers as they were.
func TestDeadMessageReplayHeaders(t *testing.T) {
	at := time.Date(2026, 11, 30, 12, 0, 0, 5, time.UTC)
	d := adapter.DeadMessage{Headers: map[string][]string{
		"Order-Key": {"o-1"}, adapter.EventTimeHeader: {"garbage"}, "traceparent": {"old"}, "Dead-Letter-Id": {"x"},
	}}
	got := d.ReplayHeaders(outbox.Message{EventTime: at, Trace: map[string]string{"traceparent": "new"}}, "Dead-Letter-Id")
	want := map[string][]string{"Order-Key": {"o-1"}, adapter.EventTimeHeader: {adapter.FormatEventTime(at)}, "traceparent": {"new"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ReplayHeaders = %v, want %v", got, want)
	}
	if d.Headers[adapter.EventTimeHeader][0] != "garbage" || len(d.Headers) != 4 {
		t.Fatalf("the dead letter's headers changed: %v", d.Headers)
	}
	// Without an event time the message's own header stays as it was.
	if got := d.ReplayHeaders(outbox.Message{}); got[adapter.EventTimeHeader][0] != "garbage" {
		t.Fatalf("without an event time: %v", got)
	}
}

// TestParseDeadLetter: a payload that is not a dead message fails
// permanently, naming the row.
func TestParseDeadLetter(t *testing.T) {
	for _, p := range []string{`not json`, `{"body":"e30="}`} {
		_, err := adapter.ParseDeadLetter("nats", outbox.Message{ID: 9, Payload: []byte(p)})
		if !errors.Is(err, outbox.ErrPermanent) {
			t.Errorf("%s: %v, want a permanent error", p, err)
		}
	}
	d, err := adapter.ParseDeadLetter("nats", outbox.Message{Payload: []byte(`{"origin":"S/c/1","source":"s.a","body":"e30="}`)})
	if err != nil || d.Source != "s.a" || string(d.Body) != "{}" {
		t.Fatalf("ParseDeadLetter = %+v, %v", d, err)
	}
}
