//go:build loyalty_kafka

package main

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
)

// TestDemoKafkaSeedBrokers runs the scenario with -kafka: the demo's path
// for a cluster it did not start, reached over TCP through seed brokers,
// with the topic created and deleted by Kafka protocol requests. No Kafka
// server runs here, so the cluster is a kfake started by the test, outside
// the demo, and named only by its addresses.
func TestDemoKafkaSeedBrokers(t *testing.T) {
	needKafkaDemoDB(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(3))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	seeds := strings.Join(c.ListenAddrs(), ",")
	checkAuditOf(t, false, "-broker", "kafka", "-kafka", seeds, "-orders", "300")
}
