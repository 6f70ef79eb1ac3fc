package mqtt_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/mqtt"
	"github.com/txclaim/idempotent/postgres"
)

func effect(context.Context, *sql.Tx, *paho.Publish) error { return nil }

// unitMiddleware is a Middleware on a database that is never reached.
func unitMiddleware(t *testing.T, opts ...idempotent.Option) *idempotent.Middleware {
	t.Helper()
	db, err := sql.Open("postgres", "postgres://127.0.0.1:1/none?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	mw, err := idempotent.New(db, postgres.New(), "loyalty", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// Bad arguments are refused by the constructors and by Run, each error
// naming the problem.
func TestRefusesBadArguments(t *testing.T) {
	mw := unitMiddleware(t)
	for _, tc := range []struct {
		name string
		err  func() error
		want string
	}{
		{"nil handler", func() error { _, err := mqtt.NewConsumer(mw, nil); return err }, "nil handler"},
		{"nil option", func() error { _, err := mqtt.NewConsumer(mw, effect, nil); return err }, "nil option"},
		{"batch size on a per-message consumer", func() error { _, err := mqtt.NewConsumer(mw, effect, mqtt.WithBatchSize(5)); return err }, "NewBatchConsumer only"},
		{"zero workers", func() error { _, err := mqtt.NewConsumer(mw, effect, mqtt.WithWorkers(0)); return err }, "WithWorkers"},
		{"nil sender publisher", func() error { _, err := mqtt.NewSender(nil, "t"); return err }, "nil publisher"},
		{"QoS 0 sender", func() error { _, err := mqtt.NewSender(&paho.Client{}, "t", mqtt.WithQoS(0)); return err }, "want 1 or 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.err()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	c, err := mqtt.NewConsumer(mw, effect)
	if err != nil {
		t.Fatal(err)
	}
	dial := func(context.Context) (net.Conn, error) { return nil, errors.New("unused") }
	for _, tc := range []struct {
		s    mqtt.Session
		want string
	}{
		{mqtt.Session{ClientID: "a", Filters: []string{"t"}}, "Dial is nil"},
		{mqtt.Session{Dial: dial, Filters: []string{"t"}}, "ClientID is empty"},
		{mqtt.Session{Dial: dial, ClientID: "a"}, "Filters is empty"},
		{mqtt.Session{Dial: dial, ClientID: "a", Filters: []string{"t"}, QoS: 3}, "want 1 or 2"},
		{mqtt.Session{Dial: dial, ClientID: "a", Filters: []string{"t"}, SessionExpiry: time.Millisecond}, "SessionExpiry"},
	} {
		if err := c.Run(context.Background(), tc.s); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Run(%+v): %v, want an error containing %q", tc.s, err, tc.want)
		}
	}
}

// A partitioned Middleware needs the producer's event time: a consumer
// that reads none is refused at construction.
func TestRefusedWithoutEventTimeOnPartitions(t *testing.T) {
	mw := unitMiddleware(t, idempotent.WithDailyPartitions(1), idempotent.WithRetention(48*time.Hour))
	if _, err := mqtt.NewConsumer(mw, effect, mqtt.WithoutEventTime()); !errors.Is(err, adapter.ErrNoProducerEventTime) {
		t.Fatalf("%v, want adapter.ErrNoProducerEventTime", err)
	}
}
