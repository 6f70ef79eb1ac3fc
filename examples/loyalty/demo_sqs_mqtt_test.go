package main

import (
	"io"
	"os"
	"reflect"
	"strings"
	"testing"
)

// TestDemoSQS runs the scenario with -broker sqs on the SQS API server of
// IDEMPOTENT_SQS_ENDPOINT, or the local moto server, with the embedded
// SQLite, on 400 orders (enough for crashes: one every 250 deliveries).
// It skips when the server does not answer, except under CI.
func TestDemoSQS(t *testing.T) {
	ep := os.Getenv("IDEMPOTENT_SQS_ENDPOINT")
	if ep == "" {
		ep = defaultSQS
	}
	needBroker(t, "set IDEMPOTENT_SQS_ENDPOINT to run the SQS demo", "-broker", "sqs", "-sqs", ep)
	// As with pub/sub, whether the two copies of an order meet in the
	// naive consumer's gap is down to chance: only the library's audit is
	// asserted exact (and the naive run's never short).
	checkAuditOf(t, false, "-broker", "sqs", "-sqs", ep, "-orders", "400")
}

// TestDemoMQTT runs the scenario with -broker mqtt on the broker of
// IDEMPOTENT_MQTT_ADDR, or the local Mosquitto, with the embedded SQLite,
// on 400 orders (enough for crashes: one every 250 deliveries). It skips
// when the broker does not answer, except under CI.
func TestDemoMQTT(t *testing.T) {
	addr := os.Getenv("IDEMPOTENT_MQTT_ADDR")
	if addr == "" {
		addr = defaultMQTT
	}
	needBroker(t, "set IDEMPOTENT_MQTT_ADDR to run the MQTT demo", "-broker", "mqtt", "-mqtt", addr)
	checkAuditOf(t, false, "-broker", "mqtt", "-mqtt", addr, "-orders", "400")
}

// TestSQSAndMQTTFlags checks -broker sqs and mqtt's flags: their defaults,
// the build tags they need, and their refusals, which quote no password.
func TestSQSAndMQTTFlags(t *testing.T) {
	t.Setenv("IDEMPOTENT_SQS_ENDPOINT", "")
	t.Setenv("IDEMPOTENT_MQTT_ADDR", "")
	o, err := parseFlags([]string{"-broker", "sqs"}, io.Discard)
	if err != nil || o.broker != "sqs" || o.sqsEndpoint != defaultSQS || o.db.kind != "sqlite" {
		t.Errorf("-broker sqs: %+v, %v", o, err)
	}
	if tags := missingParts(o); !compiled("sqs") && !reflect.DeepEqual(tags, []string{"loyalty_sqs"}) {
		t.Errorf("-broker sqs needs tags %v, want [loyalty_sqs]", tags)
	}
	o, err = parseFlags([]string{"-broker", "mqtt", "-mqtt", "127.0.0.1:1884"}, io.Discard)
	if err != nil || o.broker != "mqtt" || o.mqttAddr != "127.0.0.1:1884" {
		t.Errorf("-broker mqtt -mqtt 127.0.0.1:1884: %+v, %v", o, err)
	}
	if tags := missingParts(o); !compiled("mqtt") && !reflect.DeepEqual(tags, []string{"loyalty_mqtt"}) {
		t.Errorf("-broker mqtt needs tags %v, want [loyalty_mqtt]", tags)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-sqs", "http://127.0.0.1:5000"}, "-sqs needs -broker sqs"},
		{[]string{"-broker", "sqs", "-mqtt", "127.0.0.1:1883"}, "-mqtt needs -broker mqtt"},
		{[]string{"-broker", "sqs", "-sqs", "amqp://127.0.0.1:5000"}, "-sqs: want an http:// or https:// endpoint"},
		{[]string{"-broker", "sqs", "-sqs", "http://u:secret@127.0.0.1:5000"}, "no user or password"},
		{[]string{"-broker", "mqtt", "-mqtt", "127.0.0.1"}, `-mqtt "127.0.0.1": want the broker's host:port`},
		{[]string{"-broker", "mqtt", "-db", "oracle://x"}, "oracle:// is no database the demo knows"},
		{[]string{"-http", "-sqs", "http://127.0.0.1:5000"}, "-sqs is a broker's flag"},
	} {
		_, err := parseFlags(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "secret") {
			t.Errorf("%v: %v, want an error with %q and no password", tc.args, err, tc.want)
		}
	}
}
