package idempgx

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/txclaim/idempotent"
)

// An Option configures a Middleware. Options are checked by New: a bad value
// is an error from New, never a surprise at the first message.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	table       string
	iso         pgx.TxIsoLevel
	retry       idempotent.RetryPolicy
	lockTimeout time.Duration
	observer    idempotent.Observer
	retention   time.Duration
	skew        time.Duration
	clock       func() time.Time
	leadDays    int
	seen        idempotent.Seen
	coalesce    idempotent.Coalescing
	coalescing  bool // WithCoalescing was given
	queuedOnly  bool
	ordering    *Ordering     // WithOrdering
	lease       time.Duration // WithHorizonLease
}

func defaultConfig() config {
	return config{
		table:     idempotent.DefaultTable,
		retry:     idempotent.DefaultRetryPolicy(),
		retention: idempotent.DefaultRetention,
		skew:      idempotent.DefaultClockSkew,
		clock:     time.Now,
	}
}

// core returns the options of the database/sql Middleware that shares this
// one's claim table (see Middleware.Core).
func (c *config) core() []idempotent.Option {
	opts := []idempotent.Option{
		idempotent.WithTable(c.table),
		idempotent.WithRetry(c.retry),
		idempotent.WithRetention(c.retention),
		idempotent.WithClockSkew(c.skew),
		idempotent.WithClock(c.clock),
	}
	if c.leadDays > 0 {
		opts = append(opts, idempotent.WithDailyPartitions(c.leadDays))
	}
	if c.ordering != nil {
		// The core checks the gap settings, creates the tables and
		// validates ordering fields.
		opts = append(opts, idempotent.WithOrdering(c.ordering.coreOrdering()))
	}
	if c.lease > 0 {
		// The core checks the lease, and caches the horizon for its own
		// claims (ClaimMessage on the pgx stdlib pool) under it.
		opts = append(opts, idempotent.WithHorizonLease(c.lease))
	}
	if c.coalescing {
		// The core checks the bounds, and reports them in Config.
		opts = append(opts, idempotent.WithCoalescing(c.coalesce))
	}
	return opts
}

// WithTable sets the claim table, as "table" or "schema.table", with the same
// rules as idempotent.WithTable. Default is "processed_messages".
func WithTable(name string) Option {
	return optionFunc(func(c *config) error {
		c.table = name
		return nil
	})
}

// WithIsolation sets the isolation level of the transactions the Middleware
// opens: pgx.Serializable, pgx.RepeatableRead, pgx.ReadCommitted or
// pgx.ReadUncommitted. Under pgx.Serializable concurrent duplicates fail with
// serialization errors instead of waiting; the middleware retries them and
// they end as Duplicate. Default is the server's default level.
func WithIsolation(level pgx.TxIsoLevel) Option {
	return optionFunc(func(c *config) error {
		switch level {
		case pgx.Serializable, pgx.RepeatableRead, pgx.ReadCommitted, pgx.ReadUncommitted:
		default:
			return fmt.Errorf("idempgx: WithIsolation: unknown isolation level %q", string(level))
		}
		c.iso = level
		return nil
	})
}

// WithRetry sets the retry policy for serialization failures, deadlocks and
// lost connections of the claim's transaction. Default is
// idempotent.DefaultRetryPolicy().
func WithRetry(p idempotent.RetryPolicy) Option {
	return optionFunc(func(c *config) error {
		switch {
		case p.MaxAttempts < 1:
			return fmt.Errorf("idempgx: WithRetry: MaxAttempts is %d, want at least 1", p.MaxAttempts)
		case p.InitialBackoff < 0:
			return fmt.Errorf("idempgx: WithRetry: InitialBackoff is negative (%v)", p.InitialBackoff)
		case p.MaxBackoff < p.InitialBackoff:
			return fmt.Errorf("idempgx: WithRetry: MaxBackoff %v is less than InitialBackoff %v", p.MaxBackoff, p.InitialBackoff)
		}
		c.retry = p
		return nil
	})
}

// WithLockTimeout bounds how long a delivery waits behind an in-flight
// transaction holding the same claim: SET LOCAL lock_timeout travels in the
// same round trip as BEGIN and the claim, and lasts for the whole
// transaction. A claim that waits longer fails with an error matching
// idempotent.ErrClaimBusy. Default is no timeout.
func WithLockTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("idempgx: WithLockTimeout: %v is not a positive duration", d)
		}
		c.lockTimeout = d
		return nil
	})
}

// WithObserver sets the observer told of every outcome and every retry, as
// idempotent.WithObserver does. Default is none.
func WithObserver(o idempotent.Observer) Option {
	return optionFunc(func(c *config) error {
		if o == nil {
			return errors.New("idempgx: WithObserver: nil observer")
		}
		c.observer = o
		return nil
	})
}

// WithRetention sets the retention window, as idempotent.WithRetention does:
// ProcessMessage refuses messages older than d with
// idempotent.ErrBeyondRetention. Default is idempotent.DefaultRetention.
func WithRetention(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("idempgx: WithRetention: %v is not a positive duration", d)
		}
		c.retention = d
		return nil
	})
}

// WithClockSkew sets the clock-skew margin, as idempotent.WithClockSkew
// does. Default is idempotent.DefaultClockSkew.
func WithClockSkew(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < 0 {
			return fmt.Errorf("idempgx: WithClockSkew: %v is negative", d)
		}
		c.skew = d
		return nil
	})
}

// WithClock sets the clock read for the retention fence. Default is
// time.Now.
func WithClock(now func() time.Time) Option {
	return optionFunc(func(c *config) error {
		if now == nil {
			return errors.New("idempgx: WithClock: nil clock")
		}
		c.clock = now
		return nil
	})
}

// WithDailyPartitions selects partitioned mode, as
// idempotent.WithDailyPartitions does: every message needs its event time
// (Message.EventTime), which chooses its claim's partition. Default is a plain
// table.
func WithDailyPartitions(leadDays int) Option {
	return optionFunc(func(c *config) error {
		if leadDays < 1 {
			return fmt.Errorf("idempgx: WithDailyPartitions: %d lead days, want at least 1", leadDays)
		}
		c.leadDays = leadDays
		return nil
	})
}

// WithSeen sets a duplicate pre-check consulted before any connection is
// taken from the pool, as idempotent.WithSeen does for the database/sql
// Middleware: a hit returns Duplicate at once; a key is recorded only after
// its claim committed (or was found). Default is none.
func WithSeen(s idempotent.Seen) Option {
	return optionFunc(func(c *config) error {
		if s == nil {
			return errors.New("idempgx: WithSeen: nil Seen")
		}
		c.seen = s
		return nil
	})
}

// WithCoalescing makes concurrent ProcessMessage calls (and WrapMessage's)
// share transactions, as idempotent.WithCoalescing does for the
// database/sql Middleware, with the same bounds and the same contract:
// calls arriving within c.Wait of the first, up to c.Max of them, run in
// one transaction on one connection of the pool; each new message's
// handler runs on its own caller's goroutine, one at a time, with a pgx.Tx
// of its own on the group's connection; each call returns its own outcome
// after the group's COMMIT; a handler's failure (its error, its panic, a
// refused Commit or Rollback, a failed statement it swallowed, its
// context ending before the COMMIT) fails its own message only; a failure
// of the transaction itself is retried for the whole group; a claim that
// fails for good sends its own message to a transaction of its own. A
// call left alone when the wait ends runs as without the option.
//
// The messages run in key order, and each one's claim is sent just before
// its handler runs (the first with BEGIN): a group of n new messages whose
// handlers send h statements costs n·(1 + h) + 1 round trips. By default a
// handler's failure rolls the group back and the group runs again without
// that message (the others' handlers run again); each claim, and COMMIT,
// are checked to run in the group's own transaction (dialect.TxFencer).
// With c.Savepoints each message's claim and handler run under a savepoint
// instead, and a failure is rolled back to it while the others go on; the
// SAVEPOINT, and the RELEASE of the previous message's, are sent with the
// message's claim, so a savepoint costs no round trip of its own — only a
// failure costs one. c.LockWait's bound is set in the first round trip; a
// claim or a handler that waits longer for a lock leaves the group and
// runs alone.
//
// A handler that ends the group's transaction (a COMMIT, END or ROLLBACK
// statement, through its pgx.Tx or its Conn, with or without a BEGIN after
// it) fails its own message with an error matching idempotent.ErrAutocommit
// saying that its claim may have committed with a part of its effect; the
// messages after it were not claimed in that transaction, and the group
// runs again without it — a message before it whose claim and effect its
// COMMIT committed comes back Duplicate. A COMMIT that fails for good, with
// no message to blame (a deferred constraint), sends every message to a
// transaction of its own.
//
// ProcessMessages is not coalesced. The core Middleware (Core) is given
// the same option. Default is off.
func WithCoalescing(c idempotent.Coalescing) Option {
	return optionFunc(func(cfg *config) error {
		cfg.coalesce, cfg.coalescing = c, true
		return nil
	})
}

// WithQueuedOnly declares that the Middleware's handlers only queue their
// statements (Queue) and never run one at once: a handler's Exec, Query,
// QueryRow, SendBatch, CopyFrom, Begin and Prepare then refuse, with an
// error matching ErrQueuedOnly that fails its message even if swallowed,
// and its Conn returns nil. In exchange, under WithCoalescing's optimistic
// design, a group runs in one round trip whatever its size: since no
// handler can read the database or end the transaction, what a handler
// queues does not depend on its claim, so the group runs its handlers
// first, side by side on their callers' goroutines, then sends BEGIN, the
// fence, every message's claim, every queued statement and COMMIT in one
// pipeline, each claim made to fail when it inserts nothing. When one does
// (a duplicate, a message beyond the retention horizon) or a queued
// statement fails, nothing of that pipeline applies, and the group goes
// on in two round trips with the statements already queued — every claim
// with BEGIN, every queued statement with COMMIT — which tell each
// message's outcome: a duplicate's handler may thus have run, its
// statements never applied. A message whose queued statement fails, whose
// handler fails or panics, or whose caller leaves, fails alone, and the
// group runs again without it. With Coalescing.Savepoints each message is
// still claimed just before its handler. A message alone without an event
// time goes the same way: its handler first, then BEGIN, its claim, its
// statements and COMMIT in one round trip, or, after a duplicate or a
// failure, the two round trips (claim, then statements and COMMIT) with
// what it queued. Either way a handler that fails runs again, after its
// claim, only if its message is new. Default is off: handlers may mix
// queued statements with statements run at once.
func WithQueuedOnly() Option {
	return optionFunc(func(c *config) error {
		c.queuedOnly = true
		return nil
	})
}
