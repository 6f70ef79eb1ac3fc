package adapter

import (
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/txclaim/idempotent"
)

// Transport describes, for Config, what a transport's deliveries of type
// T carry. An adapter fills it in once.
type Transport[T any] struct {
	// Name names the adapter in errors, such as "rabbitmq".
	Name string
	// DefaultKey is the key function when none is given: the transport's
	// producer-set message id (an AMQP message-id, a Nats-Msg-Id, a
	// Watermill UUID; for Kafka, which has none, a header).
	DefaultKey KeyFunc[T]
	// Header returns the value of the delivery's header (message
	// attribute, metadata field) name, and whether it has one. The event
	// time is read from EventTimeHeader through it.
	Header func(msg T, name string) (string, bool)
	// Time returns the delivery's transport time (zero when it has none),
	// for WithTransportEventTime; nil when the transport has none.
	Time func(msg T) time.Time
	// TimeName names the transport time in docs and errors, such as "the
	// AMQP timestamp property".
	TimeName string
	// Payload returns the delivery's body, kept with an ordered message
	// that has to wait for its predecessor (idempotent.Message.Payload);
	// nil when the adapter does not give it.
	Payload func(msg T) []byte
	// Headers, when set, returns every header (field) of a delivery but
	// its body, all kept with an ordered message that has to wait for its
	// predecessor (idempotent.Message.Headers), for an adapter whose
	// handlers read more of a delivery than its body and the library's
	// headers (a Redis Streams entry's fields, a Kafka record's headers);
	// nil keeps the library's headers only.
	Headers func(msg T) map[string]string
	// Ordered says that a delivery waiting to be given again holds back
	// those behind it (a Kafka partition): the default future bound is then
	// the clock-skew margin instead of DefaultFutureBound (Rule.Ordered).
	// Set it, too, for a transport that may be either, depending on a
	// driver or broker setting the adapter cannot see.
	Ordered bool
	// System names the messaging system for a Tracer, as OpenTelemetry's
	// messaging.system does ("rabbitmq", "kafka"…).
	System string
	// Destination returns the queue, topic, subject or stream a delivery
	// was consumed from, for a Tracer; nil when unknown.
	Destination func(msg T) string
	// MessageID returns the transport's id of a delivery, for a Tracer;
	// nil when it has none.
	MessageID func(msg T) string
}

// timeSource is where a Config reads each delivery's event time.
type timeSource int

const (
	fromHeader    timeSource = iota // EventTimeHeader, the default
	fromFunc                        // SetEventTime
	fromTransport                   // SetTransportEventTime
	fromNone                        // SetNoEventTime
)

// Config is the configuration every adapter shares: the key function, the
// event-time source, the observer, the retry delays, the future bound, the
// workers, the shutdown timeout and the poison predicate. An adapter keeps
// one in its own configuration; its options of the same names (WithKey,
// WithEventTime, WithTransportEventTime, WithoutEventTime, WithObserver,
// WithRetryDelay, WithFutureBound, WithWorkers, WithShutdownTimeout,
// WithPoison) call the setters, which check their arguments, and its
// constructor calls Check. Create one with NewConfig.
type Config[T any] struct {
	tr Transport[T]

	key       KeyFunc[T]
	source    timeSource
	timeFn    func(msg T) (time.Time, error)
	observer  Observer
	retryInit time.Duration
	retryMax  time.Duration
	future    time.Duration
	workers   int
	shutdown  time.Duration
	isPoison  func(error) bool
	tracer    Tracer
	checked   *idempotent.Config
	partition bool
	tenants   *idempotent.Tenants
	tenantOf  func(msg T) (string, error)
}

// Default values of Config.
const (
	// DefaultWorkers is how many deliveries a consumer handles at once
	// unless told otherwise.
	DefaultWorkers = 1
	// MaxWorkers bounds SetWorkers.
	MaxWorkers = 1024
	// DefaultShutdownTimeout is how long a consumer waits, once its
	// context ended, for the handlers in flight to finish.
	DefaultShutdownTimeout = 30 * time.Second
)

// NewConfig returns the defaults for transport tr: the default key, the
// event time from EventTimeHeader, the Middleware's default retry policy
// for delays, DefaultFutureBound (the clock-skew margin if tr is Ordered),
// DefaultWorkers and DefaultShutdownTimeout.
func NewConfig[T any](tr Transport[T]) Config[T] {
	return Config[T]{tr: tr, key: tr.DefaultKey, workers: DefaultWorkers, shutdown: DefaultShutdownTimeout}
}

// SetKey sets the key function (the WithKey option).
func (c *Config[T]) SetKey(k KeyFunc[T]) error {
	if k == nil {
		return errors.New("WithKey: nil KeyFunc")
	}
	c.key = k
	return nil
}

// SetEventTime reads each delivery's event time with fn, a function over
// the delivery (its payload, or a header of the producer's own), instead of
// EventTimeHeader (the WithEventTime option). fn counts as a producer's
// event time: it is accepted in partitioned mode. A delivery for which fn
// fails or returns the zero time is poison.
func (c *Config[T]) SetEventTime(fn func(msg T) (time.Time, error)) error {
	if fn == nil {
		return errors.New("WithEventTime: nil function")
	}
	if c.source != fromHeader {
		return errors.New("WithEventTime: an event time source is already set")
	}
	c.source, c.timeFn = fromFunc, fn
	return nil
}

// SetTransportEventTime reads each delivery's event time from the
// transport (the WithTransportEventTime option). That time is new on every
// re-send, so a re-send after midnight would land in another day's
// partition and apply again: Check refuses it for a Middleware in
// partitioned mode. A delivery without one is poison (ErrNoEventTime).
func (c *Config[T]) SetTransportEventTime() error {
	if c.tr.Time == nil {
		return fmt.Errorf("WithTransportEventTime: %s deliveries carry no transport time", c.tr.Name)
	}
	if c.source != fromHeader {
		return errors.New("WithTransportEventTime: an event time source is already set")
	}
	c.source = fromTransport
	return nil
}

// SetNoEventTime reads no event time (the WithoutEventTime option): the
// retention fence cannot apply to the deliveries, and Check refuses it for
// a Middleware in partitioned mode.
func (c *Config[T]) SetNoEventTime() error {
	if c.source != fromHeader {
		return errors.New("WithoutEventTime: an event time source is already set")
	}
	c.source = fromNone
	return nil
}

// SetObserver sets the Observer (the WithObserver option).
func (c *Config[T]) SetObserver(o Observer) error {
	if o == nil {
		return errors.New("WithObserver: nil Observer")
	}
	c.observer = o
	return nil
}

// SetRetryDelay sets the delays of requeued deliveries (the WithRetryDelay
// option): initial for a delivery's first failure, doubling with jitter
// for each further attempt up to max, as idempotent.RetryPolicy.Backoff
// computes them. The default is idempotent.DefaultRetryPolicy's.
func (c *Config[T]) SetRetryDelay(initial, max time.Duration) error {
	if initial <= 0 || max < initial {
		return fmt.Errorf("WithRetryDelay: want 0 < initial <= max, got initial %v, max %v", initial, max)
	}
	c.retryInit, c.retryMax = initial, max
	return nil
}

// SetFutureBound sets how far ahead of the clock (past the Middleware's
// clock-skew margin) an event time may be and be requeued until the clock
// catches up; further ahead is poison (the WithFutureBound option).
// Default DefaultFutureBound, or the Middleware's clock-skew margin on an
// ordered transport (Transport.Ordered).
func (c *Config[T]) SetFutureBound(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("WithFutureBound: want a positive bound, got %v", d)
	}
	c.future = d
	return nil
}

// SetWorkers sets how many deliveries are handled at once (the
// WithWorkers option), from 1 to MaxWorkers.
func (c *Config[T]) SetWorkers(n int) error {
	if n < 1 || n > MaxWorkers {
		return fmt.Errorf("WithWorkers: want 1 to %d workers, got %d", MaxWorkers, n)
	}
	c.workers = n
	return nil
}

// SetShutdownTimeout sets how long a consumer waits, once its context
// ended, for the handlers in flight (the WithShutdownTimeout option).
func (c *Config[T]) SetShutdownTimeout(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("WithShutdownTimeout: want a positive timeout, got %v", d)
	}
	c.shutdown = d
	return nil
}

// SetPoison marks more of a handler's errors as poison, besides those
// matching ErrPoison (the WithPoison option).
func (c *Config[T]) SetPoison(isPoison func(error) bool) error {
	if isPoison == nil {
		return errors.New("WithPoison: nil function")
	}
	c.isPoison = isPoison
	return nil
}

// Check is what every adapter's constructor runs once its options are
// applied: mw must be given — or, with a tenant function (SetTenant), must
// not be: each delivery then goes to its tenant's Middleware — and a
// Middleware in partitioned mode (idempotent.WithDailyPartitions) needs
// every delivery's producer event time, so a Config reading none
// (WithoutEventTime) or the transport's (WithTransportEventTime) is
// refused with an error matching ErrNoProducerEventTime, before any
// delivery.
func (c *Config[T]) Check(mw *idempotent.Middleware) error {
	var cfg idempotent.Config
	switch {
	case c.tenants != nil && mw != nil:
		return fmt.Errorf("%s: both a Middleware and WithTenant given: with WithTenant, pass a nil Middleware (each delivery goes to its tenant's)", c.tr.Name)
	case c.tenants != nil:
		cfg = c.tenants.Config()
	case mw == nil:
		return fmt.Errorf("%s: nil Middleware", c.tr.Name)
	default:
		cfg = mw.Config()
	}
	if c.key == nil {
		return fmt.Errorf("%s: no KeyFunc: give one with WithKey", c.tr.Name)
	}
	if c.tr.Header == nil && c.source == fromHeader {
		return fmt.Errorf("%s: deliveries carry no headers: give an event time with WithEventTime or WithoutEventTime", c.tr.Name)
	}
	switch c.source {
	case fromTransport:
		if err := checkEventTimeSource(cfg, c.tr.Name); err != nil {
			return fmt.Errorf("%w; WithTransportEventTime reads %s, which a re-send stamps anew", err, c.tr.TimeName)
		}
	case fromNone:
		if err := checkEventTimeSource(cfg, c.tr.Name); err != nil {
			return fmt.Errorf("%w; WithoutEventTime reads none", err)
		}
	}
	if cfg.Ordering && c.tr.Payload == nil {
		return fmt.Errorf("%s: the Middleware was created WithOrdering, but the adapter cannot keep a delivery's body: a message parked until its predecessor applies would be released without it", c.tr.Name)
	}
	c.checked, c.partition = &cfg, cfg.Partitioned()
	return nil
}

// Workers is the number of deliveries to handle at once.
func (c *Config[T]) Workers() int { return c.workers }

// Ordering reports whether the Middleware Check was given (with
// WithTenant, every tenant's) was created WithOrdering.
func (c *Config[T]) Ordering() bool { return c.checked != nil && c.checked.Ordering }

// RefuseOrdering is the refusal, at construction, of an entry point that
// keeps no per-key order — a batch consumer, whose batch claims its
// messages together, or a claim in a transaction the adapter does not
// own — when the Middleware was created WithOrdering: an error naming
// entry, or nil. Without it every ordered message would be poison.
func (c *Config[T]) RefuseOrdering(entry string) error {
	if !c.Ordering() {
		return nil
	}
	return fmt.Errorf("%s: %s: the Middleware was created WithOrdering, but %s keeps no per-key order; use the per-message consumer", c.tr.Name, entry, entry)
}

// ShutdownTimeout is how long to wait for the handlers in flight.
func (c *Config[T]) ShutdownTimeout() time.Duration { return c.shutdown }

// Observer is the Observer set, or nil.
func (c *Config[T]) Observer() Observer { return c.observer }

// Rule is the settle rule for the Middleware Check was given: its clock
// and clock-skew margin, the retry delays, the future bound, whether the
// transport is ordered, and the poison predicate.
func (c *Config[T]) Rule() Rule {
	r := Rule{FutureBound: c.future, Ordered: c.tr.Ordered, IsPoison: c.isPoison}
	if c.retryInit > 0 {
		r.Backoff = idempotent.RetryPolicy{MaxAttempts: 1, InitialBackoff: c.retryInit, MaxBackoff: c.retryMax}
	}
	if c.checked != nil {
		cfg := c.checked
		r.ClockSkew, r.skewSet, r.Now = cfg.ClockSkew, true, cfg.Clock
	}
	return r
}

// Message reads a delivery's key, event time and ordering (OrderKeyHeader,
// OrderSeqHeader, with the payload and those headers kept for parking)
// into an idempotent Message. A key error is wrapped with idempotent.ErrInvalidKey unless it
// already matches it or ErrPoison; an event-time error with
// idempotent.ErrInvalidEventTime likewise; a delivery without the
// EventTimeHeader header has no event time, which is an error
// (ErrNoEventTime) only in partitioned mode. Every error is poison for
// Rule.Settle and names the adapter and, when known, the key.
func (c *Config[T]) Message(msg T) (idempotent.Message, error) {
	key, err := c.key(msg)
	if err != nil {
		if errors.Is(err, idempotent.ErrInvalidKey) || errors.Is(err, ErrPoison) {
			return idempotent.Message{}, fmt.Errorf("%s: %w", c.tr.Name, err)
		}
		return idempotent.Message{}, fmt.Errorf("%s: %w: key function: %w", c.tr.Name, idempotent.ErrInvalidKey, err)
	}
	m := idempotent.Message{Key: key}
	if err := c.readOrder(msg, &m); err != nil {
		return m, err
	}
	switch c.source {
	case fromNone:
		return m, nil
	case fromTransport:
		if m.EventTime = c.tr.Time(msg); m.EventTime.IsZero() {
			return m, fmt.Errorf("%s: message %q: %w: %s is not set", c.tr.Name, key, ErrNoEventTime, c.tr.TimeName)
		}
		return m, nil
	case fromFunc:
		at, err := c.timeFn(msg)
		if err != nil {
			if errors.Is(err, idempotent.ErrInvalidEventTime) || errors.Is(err, ErrPoison) {
				return m, fmt.Errorf("%s: message %q: %w", c.tr.Name, key, err)
			}
			return m, fmt.Errorf("%s: message %q: %w: event time function: %w", c.tr.Name, key, idempotent.ErrInvalidEventTime, err)
		}
		if at.IsZero() {
			return m, fmt.Errorf("%s: message %q: %w: the event time function returned the zero time", c.tr.Name, key, ErrNoEventTime)
		}
		m.EventTime = at
		return m, nil
	}
	v, _ := c.tr.Header(msg, EventTimeHeader)
	at, err := ParseEventTime(v)
	if err != nil {
		return m, fmt.Errorf("%s: message %q: %w", c.tr.Name, key, err)
	}
	if at.IsZero() && c.partition {
		return m, fmt.Errorf("%s: message %q: %w: no %s header, and the claim table is partitioned by event day", c.tr.Name, key, ErrNoEventTime, EventTimeHeader)
	}
	m.EventTime = at
	return m, nil
}

// readOrder reads the delivery's ordering headers into m (see order) when
// the Middleware Check was given keeps messages in order
// (idempotent.WithOrdering); one that does not ignores them, as it ignores
// any header it does not use: a producer that orders its messages for one
// consumer does not make them poison for the others.
func (c *Config[T]) readOrder(msg T, m *idempotent.Message) error {
	if c.checked != nil && !c.checked.Ordering {
		return nil
	}
	return c.order(msg, m)
}

// order reads the delivery's OrderKeyHeader and OrderSeqHeader into m,
// with its payload and the headers a parked message keeps.
func (c *Config[T]) order(msg T, m *idempotent.Message) error {
	if c.tr.Header == nil {
		return nil
	}
	kv, _ := c.tr.Header(msg, OrderKeyHeader)
	sv, _ := c.tr.Header(msg, OrderSeqHeader)
	key, seq, err := ParseOrder(kv, sv)
	if err != nil {
		return fmt.Errorf("%s: message %q: %w", c.tr.Name, m.Key, err)
	}
	if key == "" {
		return nil
	}
	m.OrderKey, m.OrderSeq = key, seq
	m.Headers = map[string]string{}
	if c.tr.Headers != nil {
		maps.Copy(m.Headers, c.tr.Headers(msg))
	}
	m.Headers[OrderKeyHeader], m.Headers[OrderSeqHeader] = kv, sv
	if at, ok := c.tr.Header(msg, EventTimeHeader); ok {
		m.Headers[EventTimeHeader] = at
	}
	if c.tr.Payload != nil {
		m.Payload = c.tr.Payload(msg)
	}
	return nil
}
