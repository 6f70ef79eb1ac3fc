package redisstream_test

import (
	"context"
	"testing"

	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/redisstream"
)

// TestSenderCarriesTheOrder: a row enqueued with outbox.WithOrder is added
// to the stream with its ordering key and sequence in the fields
// adapter.OrderKeyHeader and adapter.OrderSeqHeader.
func TestSenderCarriesTheOrder(t *testing.T) {
	t.Parallel()
	rdb := newClient(t, redisAddr())
	stream := testenv.UniqueName("redisstream-order")
	t.Cleanup(func() { _ = rdb.Del(context.Background(), stream).Err() })
	s, err := redisstream.NewSender(rdb, func(outbox.Message) string { return stream })
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Send(ctx, outbox.Message{ID: 1, IdempotencyKey: "k", Payload: []byte(`{}`), OrderKey: "account:42", OrderSeq: 7}); err != nil {
		t.Fatal(err)
	}
	entries, err := rdb.XRange(ctx, stream, "-", "+").Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("XRANGE: %v, %v", entries, err)
	}
	v := entries[0].Values
	k, _ := v[adapter.OrderKeyHeader].(string)
	q, _ := v[adapter.OrderSeqHeader].(string)
	if key, seq, err := adapter.ParseOrder(k, q); err != nil || key != "account:42" || seq != 7 {
		t.Errorf("fields %v: %q, %d, %v", v, key, seq, err)
	}
}
