package mqtt_test

import (
	"context"
	"testing"

	"github.com/eclipse/paho.golang/paho"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/mqtt"
	"github.com/txclaim/idempotent/outbox"
)

// recordingPublisher keeps what it is asked to publish.
type recordingPublisher struct{ got []*paho.Publish }

func (p *recordingPublisher) Publish(_ context.Context, m *paho.Publish) (*paho.PublishResponse, error) {
	p.got = append(p.got, m)
	return &paho.PublishResponse{}, nil
}

// TestSenderCarriesTheOrder: a row enqueued with outbox.WithOrder is
// published with its ordering key and sequence as the user properties
// adapter.OrderKeyHeader and adapter.OrderSeqHeader.
func TestSenderCarriesTheOrder(t *testing.T) {
	t.Parallel()
	var p recordingPublisher
	s, err := mqtt.NewSender(&p, "ledger")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(context.Background(), outbox.Message{ID: 1, IdempotencyKey: "k", Payload: []byte(`{}`), OrderKey: "account:42", OrderSeq: 7}); err != nil {
		t.Fatal(err)
	}
	props := p.got[0].Properties.User
	key, seq, err := adapter.ParseOrder(props.Get(adapter.OrderKeyHeader), props.Get(adapter.OrderSeqHeader))
	if err != nil || key != "account:42" || seq != 7 {
		t.Errorf("user properties %v: %q, %d, %v", props, key, seq, err)
	}
}
