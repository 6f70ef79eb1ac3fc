// Package mqtt consumes MQTT 5 messages exactly once in effect: each
// message is claimed through an idempotent.Middleware in the transaction
// of its effect, and acknowledged (PUBACK at QoS 1, PUBREC at QoS 2) only
// after that transaction has committed, through paho.golang's manual
// acknowledgement.
//
// A [Consumer] runs on a persistent session ([Session]: Clean Start false,
// a session expiry), so that what it had not acknowledged when its
// connection ended — the process crashed between the commit and the
// PUBACK, the network failed, the broker restarted with persistence on —
// is sent again on the session's next connection; the claim finds it and
// the delivery is a Duplicate, with no second effect. QoS 2's exactly-once
// ends at the broker: after a session is resumed a client still sees a
// message again, and only the claim makes its effect happen once. Shared
// subscriptions ("$share/GROUP/FILTER" in Session.Filters) spread a topic
// over the consumers of a group.
//
// The key is the producer's user property [DefaultKeyProperty]
// ("idempotency-key"), the event time the user property
// adapter.EventTimeHeader ("Idempotent-Event-Time"): MQTT has no message id
// and no time of its own. [Sender] publishes outbox rows with both.
//
// Settling, by adapter.Rule.Settle: Applied and Duplicate are acknowledged;
// poison is acknowledged and dropped (adapter.EventDeadLettered); a
// requeued message is retried by the worker itself after the rule's delay —
// MQTT has no negative acknowledgement, and a broker sends an
// unacknowledged message again only on a new connection — while it stays
// unacknowledged. Acknowledgements go back in the order the messages came
// (MQTT 5, 4.6), so a message waiting for its retry holds back those behind
// it: the adapter counts as ordered (adapter.Transport.Ordered), and its
// default future bound is the clock-skew margin.
//
// The shape — NewConsumer, NewBatchConsumer, Handler, Decode, the key
// functions and the shared options — is every adapter's; see
// docs/adapters.md and docs/mqtt.md.
package mqtt
