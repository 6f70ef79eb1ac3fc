package outbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/lib/pq"
)

// A Sender performs the calls of one kind: it sends m.Payload to the
// provider with m.IdempotencyKey as the provider's idempotency key, and
// returns nil once the provider has accepted it. It runs with no
// transaction open, under a context that ends at the call timeout.
//
// A call may be made more than once — after a failure, a timeout, or a
// relay that died mid-call — always with the same idempotency key, so the
// provider must drop repeats by key. Return an error wrapped with Permanent
// when retrying cannot help. A Sender that publishes the call as a message
// puts m.Trace in its headers, so that the trace goes on.
type Sender interface {
	Send(ctx context.Context, m Message) error
}

// SenderFunc adapts a function to the Sender interface.
type SenderFunc func(ctx context.Context, m Message) error

// Send calls f.
func (f SenderFunc) Send(ctx context.Context, m Message) error { return f(ctx, m) }

// Message is one outbox row handed to a Sender.
type Message struct {
	// ID is the row's id.
	ID int64
	// Consumer is the consumer that enqueued the call.
	Consumer string
	// MessageKey is the key of the message whose handler enqueued it.
	MessageKey string
	// Kind selects the Sender.
	Kind string
	// IdempotencyKey is the key to send to the provider.
	IdempotencyKey string
	// Payload is the JSON payload, byte for byte as enqueued.
	Payload []byte
	// Attempt is this attempt's number, 1 for the first.
	Attempt int
	// CreatedAt is when the enqueueing transaction began.
	CreatedAt time.Time
	// EventTime is the event time the call was enqueued with
	// (WithEventTime), to the nanosecond, or the zero time. A Sender that
	// publishes the call as a message carries it in the
	// adapter.EventTimeHeader header, so that its consumer claims it under
	// the original event time, on the same day.
	EventTime time.Time
	// Trace is the trace context to carry forward, by header name
	// (TraceParentHeader, TraceStateHeader, BaggageHeader): with a Tracer
	// (WithTracer), that of the attempt's span, a child of the context
	// the row was enqueued in; without one, the context stored with the
	// row, if any (nil when none). A Sender that publishes
	// the call as a message copies it into the message's headers, so that
	// the consumer's span continues the trace.
	Trace map[string]string
	// OrderKey and OrderSeq are the ordering key and sequence the call was
	// enqueued with (WithOrder), or "" and 0. A Sender that publishes the
	// call as a message carries them in the adapter.OrderKeyHeader and
	// adapter.OrderSeqHeader headers (adapter.FormatOrderSeq).
	OrderKey string
	OrderSeq int64
}

// StableEventTime is the event time a Sender that publishes m as a message
// carries forward: EventTime when the call was enqueued with one, else
// CreatedAt, when the enqueueing transaction began. Both are the row's, so
// every attempt of the relay sends the same time.
func (m Message) StableEventTime() time.Time {
	if !m.EventTime.IsZero() {
		return m.EventTime
	}
	return m.CreatedAt
}

// Backoff is the wait before retrying a failed call: Initial after the first
// failure, doubling after each further one up to Max. Each wait is drawn at
// random from the upper half of its value, so retries spread out.
type Backoff struct {
	// Initial is the wait after the first failed attempt.
	Initial time.Duration
	// Max caps the wait.
	Max time.Duration
}

// delay returns the wait after the given failed attempt (1-based).
func (b Backoff) delay(attempt int) time.Duration {
	d := b.Initial
	for i := 1; i < attempt && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	if d <= 1 {
		return d
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// Defaults of a Relay's options.
const (
	DefaultPollInterval  = time.Second
	DefaultLease         = time.Minute
	DefaultConcurrency   = 16
	DefaultBatch         = 16
	DefaultMaxAttempts   = 15
	DefaultListenerCheck = 5 * time.Second
)

// DefaultBackoff returns the backoff used when WithBackoff is not given:
// from 1s, doubling up to 10 minutes.
func DefaultBackoff() Backoff { return Backoff{Initial: time.Second, Max: 10 * time.Minute} }

// A RelayOption configures a Relay. Options are checked by NewRelay.
type RelayOption interface {
	applyRelay(*relayConfig) error
}

type relayOptionFunc func(*relayConfig) error

func (f relayOptionFunc) applyRelay(c *relayConfig) error { return f(c) }

type relayConfig struct {
	senders     map[string]Sender
	id          string
	dsn         string
	listenCheck time.Duration
	poll        time.Duration
	lease       time.Duration
	callTimeout time.Duration
	grace       time.Duration
	graceSet    bool
	concurrency int
	batch       int
	maxAttempts int
	backoff     Backoff
}

// WithSender registers s for the calls of the given kind. A relay leases
// only rows of the kinds it has senders for; at least one is required, and
// each kind may be registered once.
func WithSender(kind string, s Sender) RelayOption {
	return relayOptionFunc(func(c *relayConfig) error {
		if err := CheckKind(kind); err != nil {
			return fmt.Errorf("outbox: WithSender: %w", err)
		}
		if s == nil {
			return fmt.Errorf("outbox: WithSender(%q): nil sender", kind)
		}
		if _, dup := c.senders[kind]; dup {
			return fmt.Errorf("outbox: WithSender(%q): kind registered twice", kind)
		}
		c.senders[kind] = s
		return nil
	})
}

// WithListener makes the relay LISTEN on the outbox's channel over its own
// connection to dsn (a lib/pq connection string for the same database), so
// that Enqueue's notification wakes it as soon as the enqueueing
// transaction commits. The connection is re-established when lost; polling
// goes on meanwhile. Default is polling only.
//
// Once subscribed, the relay sends itself a test notification through the
// outbox's *sql.DB and waits for it on the LISTEN connection (see
// WithListenerCheck). If it does not arrive — dsn goes through a pooler in
// transaction mode, such as PgBouncer, where LISTEN cannot work — the relay
// reports EventListenUnavailable, closes the connection and polls only.
func WithListener(dsn string) RelayOption {
	return relayOptionFunc(func(c *relayConfig) error {
		if dsn == "" {
			return errors.New("outbox: WithListener: empty connection string")
		}
		if _, err := pq.NewConnector(dsn); err != nil {
			return fmt.Errorf("outbox: WithListener: %w", err)
		}
		c.dsn = dsn
		return nil
	})
}

// WithListenerCheck sets how long the relay waits for its test
// notification on the LISTEN connection before it concludes that LISTEN
// cannot work there (EventListenUnavailable). It must be positive. Default
// is DefaultListenerCheck (5s).
func WithListenerCheck(d time.Duration) RelayOption {
	return relayOptionFunc(func(c *relayConfig) error {
		if d <= 0 {
			return fmt.Errorf("outbox: WithListenerCheck: %v is not positive", d)
		}
		c.listenCheck = d
		return nil
	})
}

// WithRelayID names the relay in lease_owner and in events. It must be 1 to
// 128 bytes of ASCII letters, digits and . _ - : /, and unique among the
// relays running at once. Default is host name, process id and a random
// suffix.
func WithRelayID(id string) RelayOption {
	return relayOptionFunc(func(c *relayConfig) error {
		if err := checkName("relay id", id); err != nil {
			return fmt.Errorf("outbox: WithRelayID: %w", err)
		}
		c.id = id
		return nil
	})
}

// WithPollInterval sets how long the relay waits, when it found no due row,
// before looking again without a notification. It also bounds how late a
// retry after backoff, or a row whose lease expired, is picked up. Default
// is DefaultPollInterval (1s).
func WithPollInterval(d time.Duration) RelayOption {
	return relayOptionFunc(func(c *relayConfig) error {
		if d <= 0 {
			return fmt.Errorf("outbox: WithPollInterval: %v is not a positive duration", d)
		}
		c.poll = d
		return nil
	})
}

// WithLease sets how long a leased row stays reserved for the relay that
// took it. If that relay dies mid-call, another retries the row when the
// lease expires. It must exceed the call timeout. Default is DefaultLease
// (1 minute).
func WithLease(d time.Duration) RelayOption {
	return relayOptionFunc(func(c *relayConfig) error {
		if d < time.Millisecond {
			return fmt.Errorf("outbox: WithLease: %v is not a positive duration of at least 1ms", d)
		}
		c.lease = d
		return nil
	})
}

// WithCallTimeout bounds one call of a Sender; a call that runs longer is
// cancelled and counts as a failed attempt. It must be shorter than the
// lease, so that a call ends before another relay may take the row. Default
// is half the lease.
func WithCallTimeout(d time.Duration) RelayOption {
	return relayOptionFunc(func(c *relayConfig) error {
		if d <= 0 {
			return fmt.Errorf("outbox: WithCallTimeout: %v is not a positive duration", d)
		}
		c.callTimeout = d
		return nil
	})
}

// WithShutdownGrace sets how long Run lets the calls in flight finish, and
// their results be recorded, after its context ends. Calls still running
// then are cancelled and their rows left leased, as if the relay had died:
// another relay retries them when the lease expires. Zero cancels them at
// once. Default is the call timeout, so every call in flight finishes.
func WithShutdownGrace(d time.Duration) RelayOption {
	return relayOptionFunc(func(c *relayConfig) error {
		if d < 0 {
			return fmt.Errorf("outbox: WithShutdownGrace: %v is negative", d)
		}
		c.grace, c.graceSet = d, true
		return nil
	})
}

// WithConcurrency sets how many calls the relay makes at once. Default is
// DefaultConcurrency (16).
func WithConcurrency(n int) RelayOption {
	return relayOptionFunc(func(c *relayConfig) error {
		if n < 1 {
			return fmt.Errorf("outbox: WithConcurrency: %d is not a positive number", n)
		}
		c.concurrency = n
		return nil
	})
}

// WithBatch sets how many rows one lease statement takes at most (never
// more than the free call slots). Default is DefaultBatch (16).
func WithBatch(n int) RelayOption {
	return relayOptionFunc(func(c *relayConfig) error {
		if n < 1 {
			return fmt.Errorf("outbox: WithBatch: %d is not a positive number", n)
		}
		c.batch = n
		return nil
	})
}

// WithMaxAttempts sets how many attempts a row gets before it is marked
// dead. An attempt whose relay died mid-call counts. Default is
// DefaultMaxAttempts (15).
func WithMaxAttempts(n int) RelayOption {
	return relayOptionFunc(func(c *relayConfig) error {
		if n < 1 {
			return fmt.Errorf("outbox: WithMaxAttempts: %d is not a positive number", n)
		}
		c.maxAttempts = n
		return nil
	})
}

// WithBackoff sets the wait before retrying a failed call. Both durations
// must be positive and Max at least Initial. Default is DefaultBackoff().
func WithBackoff(b Backoff) RelayOption {
	return relayOptionFunc(func(c *relayConfig) error {
		switch {
		case b.Initial <= 0:
			return fmt.Errorf("outbox: WithBackoff: Initial %v is not a positive duration", b.Initial)
		case b.Max < b.Initial:
			return fmt.Errorf("outbox: WithBackoff: Max %v is less than Initial %v", b.Max, b.Initial)
		}
		c.backoff = b
		return nil
	})
}
