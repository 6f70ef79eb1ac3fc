package nats_test

import (
	"context"
	"testing"
	"time"

	idnats "github.com/txclaim/idempotent/nats"
)

// TestLagCountsWhatTheConsumerHasNotDelivered: four messages, one fetched,
// lag three.
func TestLagCountsWhatTheConsumerHasNotDelivered(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js := newJS(t, localNATS(t))
	s, name := newStream(t, js, 1)
	cons := newConsumer(t, s, "shipping", time.Minute)
	for range 4 {
		if _, err := js.Publish(ctx, name+".orders", []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	batch, err := cons.Fetch(1)
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		_ = m.Ack()
	}
	r, err := idnats.Lag(cons)
	if err != nil {
		t.Fatal(err)
	}
	lags, err := r.Lag(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(lags) != 1 || lags[0].Messages != 3 || lags[0].System != "nats" || lags[0].Destination != name || lags[0].Group != "shipping" {
		t.Errorf("lag %+v, want 3 messages of stream %s for shipping", lags, name)
	}
	if _, err := idnats.Lag(nil); err == nil {
		t.Error("nil consumer: no error")
	}
}
