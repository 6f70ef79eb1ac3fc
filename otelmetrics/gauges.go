package otelmetrics

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/deadletter"
	"github.com/txclaim/idempotent/outbox"
)

// Gauges reports the state of the tables and brokers an application runs
// on — the outbox's backlog, parked and dead-lettered messages, the
// retention horizon's age, consumers' lag — as observable gauges, read from
// their sources at each collection of the MeterProvider's readers. Create
// it with [NewGauges]; [Gauges.Close] stops the reports.
//
// The instruments, on the meter named [ScopeName]:
//
//	idempotent.outbox.backlog              {message}  rows waiting to be sent (leased ones included); idempotent.consumer, idempotent.outbox.table
//	idempotent.outbox.oldest_pending.age   s          age of the oldest of them, 0 when none; same attributes
//	idempotent.outbox.dead                 {message}  rows a relay gave up on; same attributes
//	idempotent.parked                      {message}  messages parked for their turn (WithOrdering); idempotent.consumer
//	idempotent.parked.oldest.age           s          age of the oldest park, 0 when none; idempotent.consumer
//	idempotent.dead_letters                {message}  dead letters in the outbox (package deadletter); idempotent.consumer,
//	                                                  idempotent.dead_letter.kind, messaging.destination.name (the source)
//	idempotent.retention.horizon.age       s          how long ago the claim table forgot up to; idempotent.claim_table,
//	                                                  idempotent.consumer ("" for the whole table's row)
//	messaging.consumer.lag                 {message}  messages the group has yet to receive; messaging.system,
//	                                                  messaging.consumer.group.name, messaging.destination.name,
//	                                                  messaging.destination.partition.id (when the transport has partitions)
//
// A source that fails to answer is skipped for that collection and its
// error returned to the reader; the others are reported.
type Gauges struct {
	reg metric.Registration
}

// A Source is what Gauges reads: see Outbox, Parking, DeadLetters,
// Horizon and ConsumerLag.
type Source struct {
	name    string
	observe func(ctx context.Context, in *instruments, o metric.Observer, now time.Time) error
	check   func() error
}

// instruments are the Gauges' observable instruments.
type instruments struct {
	backlog, dead, parked, deadLetters, lag metric.Int64ObservableGauge
	oldestPending, oldestParked, horizon    metric.Float64ObservableGauge
}

// Attribute keys of the library's own.
const (
	keyOutboxTable    = attribute.Key("idempotent.outbox.table")
	keyClaimTable     = attribute.Key("idempotent.claim_table")
	keyDeadLetterKind = attribute.Key("idempotent.dead_letter.kind")
)

// Outbox reports ob's backlog, the age of its oldest pending row and its
// dead rows (outbox.Outbox.Stats).
func Outbox(ob *outbox.Outbox) Source {
	return Source{name: "Outbox", check: func() error { return nilSource(ob == nil) },
		observe: func(ctx context.Context, in *instruments, o metric.Observer, _ time.Time) error {
			st, err := ob.Stats(ctx)
			if err != nil {
				return err
			}
			attrs := metric.WithAttributes(keyConsumer.String(ob.Consumer()), keyOutboxTable.String(ob.Table()))
			o.ObserveInt64(in.backlog, st.Pending, attrs)
			o.ObserveFloat64(in.oldestPending, st.OldestPending.Seconds(), attrs)
			o.ObserveInt64(in.dead, st.Dead, attrs)
			return nil
		}}
}

// Parking reports the messages mw, created with idempotent.WithOrdering,
// has parked (idempotent.Middleware.Waiting): how many, and the age of the
// oldest park.
func Parking(mw *idempotent.Middleware) Source {
	return Source{name: "Parking",
		check: func() error {
			if mw == nil {
				return nilSource(true)
			}
			if !mw.Config().Ordering {
				return fmt.Errorf("consumer %q: the Middleware was not created WithOrdering: it parks nothing", mw.Config().Consumer)
			}
			return nil
		},
		observe: func(ctx context.Context, in *instruments, o metric.Observer, now time.Time) error {
			gaps, err := mw.Waiting(ctx)
			if err != nil {
				return err
			}
			var n int64
			var oldest time.Time
			for _, g := range gaps {
				n += int64(g.Parked)
				if oldest.IsZero() || g.Since.Before(oldest) {
					oldest = g.Since
				}
			}
			var age float64
			if !oldest.IsZero() {
				age = max(now.Sub(oldest).Seconds(), 0)
			}
			attrs := metric.WithAttributes(keyConsumer.String(mw.Config().Consumer))
			o.ObserveInt64(in.parked, n, attrs)
			o.ObserveFloat64(in.oldestParked, age, attrs)
			return nil
		}}
}

// DeadLetters reports the dead letters s sees in its outbox
// (deadletter.Store.Counts), by consumer, kind and source.
func DeadLetters(s *deadletter.Store) Source {
	return Source{name: "DeadLetters", check: func() error { return nilSource(s == nil) },
		observe: func(ctx context.Context, in *instruments, o metric.Observer, _ time.Time) error {
			counts, err := s.Counts(ctx)
			if err != nil {
				return err
			}
			for _, c := range counts {
				o.ObserveInt64(in.deadLetters, c.N, metric.WithAttributes(keyConsumer.String(c.Consumer),
					keyDeadLetterKind.String(c.Kind), semconv.MessagingDestinationName(c.Source)))
			}
			return nil
		}}
}

// Horizon reports how long ago t's retention horizon is, per row
// (idempotent.ClaimTable.Horizons): claims older may have been forgotten,
// and a message older is refused. None before the first cleanup.
func Horizon(t *idempotent.ClaimTable) Source {
	return Source{name: "Horizon", check: func() error { return nilSource(t == nil) },
		observe: func(ctx context.Context, in *instruments, o metric.Observer, now time.Time) error {
			hs, err := t.Horizons(ctx)
			if err != nil {
				return err
			}
			for _, h := range hs {
				o.ObserveFloat64(in.horizon, max(now.Sub(h.ForgottenBefore).Seconds(), 0),
					metric.WithAttributes(keyClaimTable.String(t.Name()), keyConsumer.String(h.Consumer)))
			}
			return nil
		}}
}

// ConsumerLag reports the lag r reads from its transport: an adapter's
// LagReporter (kafka.Lag, redisstream.Lag, nats.Lag).
func ConsumerLag(r adapter.LagReporter) Source {
	return Source{name: "ConsumerLag", check: func() error { return nilSource(r == nil) },
		observe: func(ctx context.Context, in *instruments, o metric.Observer, _ time.Time) error {
			lags, err := r.Lag(ctx)
			if err != nil {
				return err
			}
			for _, l := range lags {
				attrs := []attribute.KeyValue{semconv.MessagingSystemKey.String(l.System),
					semconv.MessagingConsumerGroupName(l.Group), semconv.MessagingDestinationName(l.Destination)}
				if l.Partition != "" {
					attrs = append(attrs, semconv.MessagingDestinationPartitionID(l.Partition))
				}
				o.ObserveInt64(in.lag, l.Messages, metric.WithAttributes(attrs...))
			}
			return nil
		}}
}

func nilSource(isNil bool) error {
	if isNil {
		return errors.New("nil source")
	}
	return nil
}

// NewGauges registers gauges for sources on a meter of mp. A nil or
// unusable source is an error, and nothing is registered.
func NewGauges(mp metric.MeterProvider, sources ...Source) (*Gauges, error) {
	if mp == nil {
		return nil, errors.New("otelmetrics: NewGauges: nil MeterProvider")
	}
	if len(sources) == 0 {
		return nil, errors.New("otelmetrics: NewGauges: no source")
	}
	for i, s := range sources {
		if s.observe == nil {
			return nil, fmt.Errorf("otelmetrics: NewGauges: source %d is the zero Source (use Outbox, Parking, DeadLetters, Horizon or ConsumerLag)", i)
		}
		if err := s.check(); err != nil {
			return nil, fmt.Errorf("otelmetrics: NewGauges: %s source %d: %w", s.name, i, err)
		}
	}
	m := mp.Meter(ScopeName)
	var in instruments
	ig := func(dst *metric.Int64ObservableGauge, name, desc string) error {
		var err error
		*dst, err = m.Int64ObservableGauge(name, metric.WithDescription(desc), metric.WithUnit("{message}"))
		return err
	}
	fg := func(dst *metric.Float64ObservableGauge, name, desc string) error {
		var err error
		*dst, err = m.Float64ObservableGauge(name, metric.WithDescription(desc), metric.WithUnit("s"))
		return err
	}
	if err := errors.Join(
		ig(&in.backlog, "idempotent.outbox.backlog", "Outbox rows waiting to be sent, leased ones included."),
		fg(&in.oldestPending, "idempotent.outbox.oldest_pending.age", "Age of the oldest outbox row waiting to be sent; 0 when none."),
		ig(&in.dead, "idempotent.outbox.dead", "Outbox rows a relay gave up on."),
		ig(&in.parked, "idempotent.parked", "Messages parked until their turn (WithOrdering)."),
		fg(&in.oldestParked, "idempotent.parked.oldest.age", "Age of the oldest parked message; 0 when none."),
		ig(&in.deadLetters, "idempotent.dead_letters", "Dead letters waiting in the outbox."),
		fg(&in.horizon, "idempotent.retention.horizon.age", "How long ago the claim table's retention horizon is."),
		ig(&in.lag, "messaging.consumer.lag", "Messages the consumer group has yet to receive."),
	); err != nil {
		return nil, fmt.Errorf("otelmetrics: %w", err)
	}
	reg, err := m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		now := time.Now()
		var errs []error
		for _, s := range sources {
			if err := s.observe(ctx, &in, o, now); err != nil {
				errs = append(errs, fmt.Errorf("otelmetrics: %s: %w", s.name, err))
			}
		}
		return errors.Join(errs...)
	}, in.backlog, in.oldestPending, in.dead, in.parked, in.oldestParked, in.deadLetters, in.horizon, in.lag)
	if err != nil {
		return nil, fmt.Errorf("otelmetrics: %w", err)
	}
	return &Gauges{reg: reg}, nil
}

// Close stops the reports.
func (g *Gauges) Close() error { return g.reg.Unregister() }
