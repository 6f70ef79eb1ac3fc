package brokertest

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

// Harness is what an adapter's test gives [Run]: its features and a way to
// open a fresh transport for each scenario.
type Harness interface {
	// Features says which scenarios apply to the adapter.
	Features() Features
	// Open returns a transport of the scenario's own — a topic, stream or
	// queue no other scenario uses — removed with t.Cleanup. It skips t
	// (testenv-style: Unavailable) when the broker is not there.
	Open(t *testing.T) Transport
}

// Features are the abilities of an adapter and its transport. A scenario
// that needs one the adapter lacks is skipped, with the reason logged.
type Features struct {
	// Batch: the adapter has a batch consumer, which claims a fetched
	// batch in one transaction and settles each message on its own.
	// ConsumerConfig.Batch asks for it, with ConsumerConfig.BatchHandler.
	Batch bool
	// LoseAck: the harness can make the consumer lose a delivery's ack
	// after its transaction committed (ConsumerConfig.LoseAck), as a
	// process that dies between commit and ack does; the transport then
	// delivers the message again.
	LoseAck bool
	// Kill: Consumer.Kill crashes the consumer (closes its connection)
	// and the transport redelivers what it had not acked, to the next
	// consumer started on the same Transport.
	Kill bool
	// Restart: a consumer started after another stopped on the same
	// Transport receives what the first did not settle (a durable
	// subscription, a queue). Without it the graceful-shutdown scenario
	// checks only the in-flight message.
	Restart bool
	// DeadLetter: poison is moved to a dead-letter destination (and
	// acked there), rather than terminated. It changes nothing the suite
	// checks; it is logged.
	DeadLetter bool
	// RequeueDelay: a Requeue settlement reports the settle rule's delay
	// (Settlement.Delay).
	RequeueDelay bool
	// TransportTime: the harness stamps Message.TransportTime as the
	// transport's own time of the message (a record timestamp, a publish
	// time in the metadata). Without it the across-midnight scenario
	// still re-sends, with the transport's own, later time.
	TransportTime bool
	// Refuses lists the modes the adapter cannot support: its
	// NewConsumer must refuse a Middleware with the mode's options (the
	// suite checks it does), and none of the mode's scenarios runs.
	Refuses []Mode
	// Ordered: the adapter's transport is ordered
	// (adapter.Transport.Ordered: a requeued delivery holds back those
	// behind it), so its default future bound is the Middleware's
	// clock-skew margin rather than adapter.DefaultFutureBound. The
	// future-dated scenario checks the bound the adapter has by default.
	Ordered bool
	// RefusesOrdering: the adapter cannot keep per-key order
	// (idempotent.WithOrdering), in any mode: its NewConsumer must refuse
	// a Middleware created WithOrdering, and the ordered scenarios check
	// that it does instead of running.
	RefusesOrdering bool
	// RoutesByOrderKey: the per-message consumer's workers take
	// deliveries by a hash of their ordering key (adapter.Config.Route),
	// so that messages published in order never park.
	RoutesByOrderKey bool
}

// Message is what the suite publishes.
type Message struct {
	// Key is the message's producer-assigned key: the harness puts it
	// where the consumer it builds reads the key.
	Key string
	// Headers are the producer's headers (metadata, attributes), to be
	// sent as they are. The suite sets adapter.EventTimeHeader here.
	Headers map[string]string
	// Body is the payload.
	Body []byte
	// TransportTime, when not zero, is the time the transport should
	// stamp on the message where the harness can set it (Features.
	// TransportTime); a re-send carries a later one than the first send.
	TransportTime time.Time
}

// Handler is the suite's per-message effect: the harness runs it for each
// message the Middleware claims, inside the claim's transaction, with the
// message's body.
type Handler func(ctx context.Context, tx *sql.Tx, body []byte) error

// BatchHandler is the suite's batch effect: the bodies of a batch's fresh
// messages, in their order in the batch, in one transaction.
type BatchHandler func(ctx context.Context, tx *sql.Tx, bodies [][]byte) error

// ConsumerConfig is what Transport.NewConsumer builds a consumer from.
type ConsumerConfig struct {
	// Middleware is the idempotent.Middleware the consumer claims with.
	// The suite owns it: its table, clock and observer.
	Middleware *idempotent.Middleware
	// DB is the Middleware's database (a guarded one: OpenGuarded), for an
	// adapter whose constructor takes it too or that keeps tables of its own
	// beside the claim table (the scenario's schema is the claim table's).
	DB *sql.DB
	// Handler is the effect, for a per-message consumer.
	Handler Handler
	// Batch asks for a batch consumer (Features.Batch) of batches of at
	// most BatchSize messages, running BatchHandler.
	Batch        bool
	BatchSize    int
	BatchHandler BatchHandler
	// Workers is how many messages the consumer may handle at once (at
	// least 1).
	Workers int
	// NoEventTime asks for a consumer that reads no event time (the
	// adapter's WithoutEventTime): NewConsumer must refuse it for a
	// partitioned Middleware with an error matching
	// adapter.ErrNoProducerEventTime.
	NoEventTime bool
	// LoseAck, when set (Features.LoseAck), is asked after a delivery
	// settled as Ack; when it returns true the ack must not reach the
	// transport (the settlement is still reported), so the message comes
	// again. The suite returns true at most once per key.
	LoseAck func(key string) bool
	// Observer must be given to the adapter's WithObserver: the suite
	// reads the consumer's settlements from its events. Exactly one of
	// EventApplied, EventDuplicate, EventRequeued, EventReleased and
	// EventDeadLettered must be reported per delivery, with the delivery's
	// key in Event.Message.Key.
	Observer adapter.Observer
}

// Settlement is how the consumer settled one delivery, as the suite reads
// it from the adapter's events: EventApplied and EventDuplicate are Ack,
// EventRequeued and EventReleased Requeue, EventDeadLettered DeadLetter.
type Settlement struct {
	// Key is the message key (Message.Key).
	Key string
	// Action is what the consumer told the transport: adapter.Ack,
	// adapter.Requeue (nack, nak, a message released at shutdown), or
	// adapter.DeadLetter (dead-lettered or terminated).
	Action adapter.Action
	// Err is the error that requeued or poisoned the delivery. A Requeue
	// with a nil Err is a delivery handed back without running the
	// handler (it arrived while the consumer shut down).
	Err error
	// Delay is the requeue delay, where the adapter reports one
	// (Features.RequeueDelay).
	Delay time.Duration
}

// Transport is one scenario's destination on the broker.
type Transport interface {
	// Publish sends m, returning once the broker has it.
	Publish(ctx context.Context, m Message) error
	// NewConsumer builds a consumer over cfg with the adapter's
	// constructors, not yet running. Its error is the constructors'.
	NewConsumer(cfg ConsumerConfig) (Consumer, error)
}

// Consumer is one consumer process of a Transport.
type Consumer interface {
	// Start starts consuming in the background; it returns once the
	// consumer receives messages (or an error).
	Start(ctx context.Context) error
	// Stop shuts the consumer down gracefully: no new deliveries,
	// in-flight handlers finish and are settled; it returns when they
	// are. Stop after Kill, or twice, returns nil.
	Stop(ctx context.Context) error
	// Kill crashes the consumer (Features.Kill): its connection closes,
	// and what it had not acked is delivered again to the next consumer.
	// It must not wait for in-flight handlers.
	Kill() error
}

// Inspector is what a [Transport] implements so that the suite checks
// settlements at the broker, not only through the adapter's events: an
// adapter that reports an ack it never sent, or acks a message whose
// transaction then fails, is caught there. A Transport of an adapter with
// Features.DeadLetter must implement it; without it the suite logs that
// the broker is not inspected.
type Inspector interface {
	// Unsettled returns how many of the scenario's messages the broker
	// still holds for its consumers, neither acked nor dead-lettered: those
	// never delivered and those delivered and not acked (pending,
	// unacked, a Kafka partition's records past the stored offset). The
	// suite asks once every consumer has stopped.
	Unsettled(ctx context.Context) (int, error)
	// DeadLetters returns the keys of the messages that reached the
	// scenario's dead-letter destination so far, one per dead letter
	// (Features.DeadLetter); nil where poison is terminated. The suite
	// polls it until a dead letter it expects is there.
	DeadLetters(ctx context.Context) ([]string, error)
}

// PositionStore is what a [Transport] implements whose adapter stores its
// position in the claim's database (a Kafka consumer's offsets table), so
// that the suite checks the position moves in the claim's own transaction:
// a position stored in a transaction of its own, before or after the
// effect's, redelivers or loses a message when the process dies between
// the two.
type PositionStore interface {
	// PositionTxid returns the id of the database transaction that last
	// wrote the consumer's stored position (Postgres: the row's xmin, as
	// text).
	PositionTxid(ctx context.Context) (string, error)
}
