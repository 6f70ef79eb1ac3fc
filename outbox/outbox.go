package outbox

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

// Outbox writes one consumer's outbound calls into the outbox table, and is
// what relays, Cleanup and Stats work on. It is safe for concurrent use;
// create one per consumer and share it.
type Outbox struct {
	db           *sql.DB
	consumer     string
	table        dialect.Table
	q            statements
	channel      string
	notify       bool
	observer     Observer
	tracer       Tracer
	cleanupBatch int
}

// New returns an Outbox that writes calls for consumer into the outbox
// table of db. consumer is the name of the service enqueueing (use the same
// name as its idempotent.Middleware): it is part of every derived
// idempotency key. It must be 1 to 128 bytes of ASCII letters, digits and
// . _ - : /, starting with a letter or digit.
//
// New sends nothing to the database; call EnsureSchema (or run the
// migration) before the first Enqueue.
func New(db *sql.DB, consumer string, opts ...Option) (*Outbox, error) {
	if db == nil {
		return nil, errors.New("outbox: New: nil *sql.DB")
	}
	if err := checkName("consumer name", consumer); err != nil {
		return nil, fmt.Errorf("outbox: New: %w", err)
	}
	cfg := config{table: DefaultTable, notify: true, cleanupBatch: DefaultCleanupBatch}
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("outbox: New: nil option")
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	table, err := dialect.ParseTable(cfg.table)
	if err != nil {
		return nil, fmt.Errorf("outbox: New: %w", err)
	}
	return &Outbox{
		db:           db,
		consumer:     consumer,
		table:        table,
		q:            postgresStatements(table),
		channel:      notifyChannel(table),
		notify:       cfg.notify,
		observer:     cfg.observer,
		tracer:       cfg.tracer,
		cleanupBatch: cfg.cleanupBatch,
	}, nil
}

// Consumer returns the consumer name given to New.
func (o *Outbox) Consumer() string { return o.consumer }

// Table returns the outbox table's name as configured, unquoted.
func (o *Outbox) Table() string { return o.table.String() }

// Channel returns the LISTEN/NOTIFY channel Enqueue notifies and relays
// listen on. It is derived from the table name.
func (o *Outbox) Channel() string { return o.channel }

// Key returns the idempotency key Enqueue derives for a call of the given
// kind made while handling the message with msgKey for consumer: 64
// hexadecimal digits of a SHA-256 over the three, so the same message always
// yields the same key and different ones never share it.
func Key(consumer, msgKey, kind string) string {
	h := sha256.New()
	// Consumer names and kinds cannot contain NUL, nor can message keys, so
	// NUL separators make the encoding unambiguous.
	_, _ = io.WriteString(h, "idempotent-outbox-v1\x00"+consumer+"\x00"+kind+"\x00"+msgKey)
	return hex.EncodeToString(h.Sum(nil))
}

// EnsureSchema creates the outbox table and its indexes if they do not
// exist. It is safe to call from many processes at once and on every start.
func (o *Outbox) EnsureSchema(ctx context.Context) error {
	err := func() error {
		tx, err := o.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		for _, s := range o.q.schema {
			if _, err := tx.ExecContext(ctx, s); err != nil {
				return err
			}
		}
		return tx.Commit()
	}()
	if err != nil {
		return fmt.Errorf("outbox: ensure schema of %s: %w", o.table, err)
	}
	return nil
}

// Enqueue writes a call of the given kind with a JSON payload into the
// outbox, inside tx: the call is made (by a Relay, later) if and only if tx
// commits. Run it from the handler that applies the message with msgKey —
// with idempotent's Middleware.ProcessMessage, pass the handler's ctx and tx
// and the message's key (Message.Key).
//
// It returns the call's idempotency key: Key(consumer, msgKey, kind), or the
// one given by WithKey. If a row with that kind and key already exists,
// nothing is written and the error matches ErrDuplicateKey; tx stays usable.
//
// Bad input — an invalid kind, message key or key, a nil, empty or invalid
// JSON payload — returns an error before anything is sent to the database,
// so tx is untouched. A database error, such as ErrNoTable, leaves tx
// aborted: roll it back.
func (o *Outbox) Enqueue(ctx context.Context, tx *sql.Tx, msgKey, kind string, payload []byte, opts ...EnqueueOption) (string, error) {
	if tx == nil {
		return "", errors.New("outbox: Enqueue: nil transaction")
	}
	if err := CheckKind(kind); err != nil {
		return "", fmt.Errorf("outbox: Enqueue: %w", err)
	}
	if err := checkMessageKey(msgKey); err != nil {
		return "", fmt.Errorf("outbox: Enqueue: %w", err)
	}
	if err := checkPayload(payload); err != nil {
		return "", fmt.Errorf("outbox: Enqueue %s for %q: %w", kind, msgKey, err)
	}
	var cfg enqueueConfig
	for _, opt := range opts {
		if opt == nil {
			return "", errors.New("outbox: Enqueue: nil option")
		}
		if err := opt.applyEnqueue(&cfg); err != nil {
			return "", fmt.Errorf("outbox: Enqueue: %w", err)
		}
	}
	key := cfg.key
	if key == "" {
		key = Key(o.consumer, msgKey, kind)
	}
	var id int64
	var err error
	at, ns := cfg.eventTime()
	var parent, state, baggage any
	if o.tracer != nil {
		parent, state, baggage = traceColumns(o.tracer.Inject(ctx))
	}
	orderKey, orderSeq := cfg.order()
	args := []any{o.consumer, msgKey, kind, key, string(payload), at, ns, parent, state, baggage, orderKey, orderSeq}
	if o.notify {
		var discard string
		err = tx.QueryRowContext(ctx, o.q.enqueueNotify, append(args, o.channel)...).Scan(&id, &discard)
	} else {
		err = tx.QueryRowContext(ctx, o.q.enqueue, args...).Scan(&id)
	}
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return key, fmt.Errorf("outbox: Enqueue %s for %q: %w: %s", kind, msgKey, ErrDuplicateKey, key)
	case err != nil:
		return key, fmt.Errorf("outbox: Enqueue %s for %q: %w", kind, msgKey, o.tableErr(err))
	}
	if o.observer != nil {
		o.observer.Observe(ctx, Event{
			Type: EventEnqueued, ID: id, Consumer: o.consumer, MessageKey: msgKey, Kind: kind, IdempotencyKey: key,
		})
	}
	return key, nil
}

// tableErr adds ErrNoTable to an error that says the table does not exist.
func (o *Outbox) tableErr(err error) error {
	var se interface{ SQLState() string }
	if errors.As(err, &se) && se.SQLState() == "42P01" {
		return fmt.Errorf("%w: %s: %w", ErrNoTable, o.table, err)
	}
	return err
}

// Stats are gauge-like figures of an outbox table, for dashboards and
// alerts. They cover every consumer writing to the table.
type Stats struct {
	// Pending is how many rows wait to be sent, including those leased by
	// a relay right now.
	Pending int64
	// Leased is how many pending rows a relay holds a live lease on.
	Leased int64
	// OldestPending is the age of the oldest pending row (since its
	// transaction began), or 0 when none is pending. Alert when it grows.
	OldestPending time.Duration
	// Dead is how many rows were given up on and wait for an operator.
	Dead int64
}

// Stats reads the table's current figures, by the database's clock.
func (o *Outbox) Stats(ctx context.Context) (Stats, error) {
	var s Stats
	var oldestMS int64
	if err := o.db.QueryRowContext(ctx, o.q.stats).Scan(&s.Pending, &s.Leased, &oldestMS, &s.Dead); err != nil {
		return Stats{}, fmt.Errorf("outbox: stats of %s: %w", o.table, o.tableErr(err))
	}
	s.OldestPending = time.Duration(oldestMS) * time.Millisecond
	return s, nil
}

// Cleanup deletes rows sent longer than retention ago, in batches of at
// most WithCleanupBatch rows, each its own short statement, until none is
// left; it returns how many it deleted. Pending and dead rows are never
// deleted. Run it periodically, from one process or many.
//
// Keep retention at least as long as the claim table's: while a sent row
// exists, a message whose claim was cleaned up and that runs its handler
// again gets ErrDuplicateKey from Enqueue instead of a second row.
func (o *Outbox) Cleanup(ctx context.Context, retention time.Duration) (int64, error) {
	if retention <= 0 {
		return 0, fmt.Errorf("outbox: Cleanup: retention %v is not a positive duration", retention)
	}
	ms := int64((retention + time.Millisecond - 1) / time.Millisecond)
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, fmt.Errorf("outbox: cleanup of %s: %w", o.table, err)
		}
		res, err := o.db.ExecContext(ctx, o.q.cleanup, ms, o.cleanupBatch)
		if err != nil {
			return total, fmt.Errorf("outbox: cleanup of %s: %w", o.table, o.tableErr(err))
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, fmt.Errorf("outbox: cleanup of %s: rows affected: %w", o.table, err)
		}
		total += n
		if n < int64(o.cleanupBatch) {
			return total, nil
		}
	}
}
