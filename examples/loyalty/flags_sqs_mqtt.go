package main

import (
	"fmt"
	"net"
	"net/url"
	"os"
)

// defaultSQS is -broker sqs's SQS API endpoint when -sqs names none:
// $IDEMPOTENT_SQS_ENDPOINT, else the local moto server.
const defaultSQS = "http://127.0.0.1:5000"

// defaultMQTT is -broker mqtt's broker when -mqtt names none:
// $IDEMPOTENT_MQTT_ADDR, else the local Mosquitto.
const defaultMQTT = "127.0.0.1:1883"

// parseSQSFlags finishes parseFlags for -broker sqs: the endpoint of -sqs,
// and the database of -db (the cdkpubsub package is dialect-neutral).
func parseSQSFlags(o options, dsn, endpoint string) (options, error) {
	o.broker = "sqs"
	if endpoint == "" {
		if endpoint = os.Getenv("IDEMPOTENT_SQS_ENDPOINT"); endpoint == "" {
			endpoint = defaultSQS
		}
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		// The value is not quoted: it may hold a password.
		return o, fmt.Errorf("-sqs: want an http:// or https:// endpoint with a host and no user or password, such as %s", defaultSQS)
	}
	o.sqsEndpoint = endpoint
	o.brokerDesc = "Amazon SQS API (" + endpoint + ", gocloud.dev/pubsub's awssnssqs, a standard queue, visibility timeout 2s)"
	if o.db, err = parseDB(dsn); err != nil {
		return o, err
	}
	return o, nil
}

// parseMQTTFlags finishes parseFlags for -broker mqtt: the broker of
// -mqtt, and the database of -db (the mqtt package is dialect-neutral).
func parseMQTTFlags(o options, dsn, addr string) (options, error) {
	o.broker = "mqtt"
	if addr == "" {
		if addr = os.Getenv("IDEMPOTENT_MQTT_ADDR"); addr == "" {
			addr = defaultMQTT
		}
	}
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return o, fmt.Errorf("-mqtt %q: want the broker's host:port, such as %s", addr, defaultMQTT)
	}
	o.mqttAddr = addr
	o.brokerDesc = "MQTT 5 (" + addr + ", QoS 1, a persistent session per consumer process in a shared subscription)"
	var err error
	if o.db, err = parseDB(dsn); err != nil {
		return o, err
	}
	return o, nil
}
