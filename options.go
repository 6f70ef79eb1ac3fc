package idempotent

import (
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

// DefaultTable is the claim table's name when WithTable is not given.
const DefaultTable = "processed_messages"

// An Option configures a Middleware. Options are checked by New: a bad value
// is an error from New, never a surprise at the first message.
//
// There are two kinds. A [TableOption] describes the claim table — its
// name, retention, clock, partitions and the retry policy of its
// transactions — and is accepted by New and by NewClaimTable alike. Every
// other Option configures one consumer's deliveries (WithTxOptions,
// WithLockTimeout, WithObserver, WithStrictGuard, WithSeen, WithCoalescing) and is accepted
// by New only: given to NewClaimTable it does not compile.
type Option interface {
	apply(*config) error
}

// A TableOption is an Option that describes the claim table: WithTable,
// WithRetention, WithClockSkew, WithClock, WithDailyPartitions and
// WithRetry. New and NewClaimTable both take it; give the ClaimTable of a
// job the same ones as the Middlewares that use the table:
//
//	table, days := idempotent.WithTable("claims"), idempotent.WithDailyPartitions(2)
//	mw, err := idempotent.New(db, d, "loyalty", table, days, idempotent.WithObserver(o))
//	…
//	ct, err := idempotent.NewClaimTable(db, d, table, days)
//
// A []TableOption is not a []Option: to pass a slice of them to New, copy
// it into a []Option first.
type TableOption interface {
	Option
	table()
}

// optionFunc is a consumer's Option.
type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

// tableOptionFunc is a TableOption.
type tableOptionFunc func(*config) error

func (f tableOptionFunc) apply(c *config) error { return f(c) }
func (tableOptionFunc) table()                  {}

type config struct {
	table       string
	txOpts      sql.TxOptions
	retry       RetryPolicy
	lockTimeout time.Duration
	observer    Observer
	strictGuard bool
	retention   retentionConfig
	seen        Seen
	coalesce    Coalescing
}

func defaultConfig() config {
	return config{table: DefaultTable, retry: DefaultRetryPolicy(), retention: defaultRetentionConfig()}
}

// WithTable sets the claim table, as "table" or "schema.table". Each part must
// be a plain identifier (letters, digits and underscores, not starting with a
// digit, at most 63 bytes); the dialect quotes it. The schema must exist.
// Default is "processed_messages".
func WithTable(name string) TableOption {
	return tableOptionFunc(func(c *config) error {
		c.table = name
		return nil
	})
}

// WithTxOptions sets the isolation level (and read-only flag, which a claim
// cannot use) of the transactions the Middleware opens. Under sql.LevelSerializable
// concurrent duplicates fail with serialization errors instead of waiting;
// the middleware retries them and they end as Duplicate. New refuses a
// level the dialect cannot run (where it implements
// dialect.TxOptionsChecker), such as sql.LevelSnapshot on Postgres, instead
// of every BeginTx failing later. Default is the database's default
// isolation level, read-write.
func WithTxOptions(o sql.TxOptions) Option {
	return optionFunc(func(c *config) error {
		if o.ReadOnly {
			return errors.New("idempotent: WithTxOptions: a read-only transaction cannot insert a claim")
		}
		c.txOpts = o
		return nil
	})
}

// WithRetry sets the retry policy for serialization failures, deadlocks and
// lost connections: of a Middleware's deliveries and of a ClaimTable's
// schema, cleanup and partition transactions. Default is
// DefaultRetryPolicy().
func WithRetry(p RetryPolicy) TableOption {
	return tableOptionFunc(func(c *config) error {
		if err := p.validate(); err != nil {
			return fmt.Errorf("idempotent: WithRetry: %w", err)
		}
		c.retry = p
		return nil
	})
}

// WithLockTimeout bounds how long a delivery waits behind an in-flight
// transaction holding the same claim. A longer wait fails the delivery with
// ErrClaimBusy, so a stalled duplicate cannot hold a worker forever; deliver
// it again later. On Postgres the timeout lasts for the whole transaction, so
// it also bounds the handler's own lock waits (those fail with the database's
// error, not ErrClaimBusy); where the setting belongs to the session (MySQL),
// the dialect restores it right after the claim, so it bounds the claim's
// wait only. It costs one extra statement per transaction (two on MySQL).
// Default is no timeout: the duplicate waits as long as the holder runs.
func WithLockTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("idempotent: WithLockTimeout: %v is not a positive duration", d)
		}
		c.lockTimeout = d
		return nil
	})
}

// WithObserver sets the observer told of every outcome and every retry.
// Default is none.
func WithObserver(o Observer) Option {
	return optionFunc(func(c *config) error {
		if o == nil {
			return errors.New("idempotent: WithObserver: nil observer")
		}
		c.observer = o
		return nil
	})
}

// WithStrictGuard makes the Middleware read the database's transaction id right
// after the claim and again before commit, and refuse to commit (returning
// ErrAutocommit) if they differ: that catches an explicit COMMIT run inside
// the handler, or a connection pooler that moved the session. It costs two
// short queries per applied message (the measured cost is variant (d)
// against (c) in the repository's BENCHMARKS.md; docs/performance.md, "The
// strict guard's cost", says how to read it).
// When the handler fails, the id is read once more: if the session already
// left the transaction (on MySQL and MariaDB, a statement that commits
// implicitly, such as DDL, committed the claim with part of the effect), the
// error says so loudly and matches ErrAutocommit, for the effect cannot be
// rolled back any more.
//
// New fails if the dialect cannot tell transactions apart, and EnsureSchema
// fails if the server cannot run the dialect's transaction id query (MySQL
// proper has no @@in_transaction; MariaDB has). Default is off.
func WithStrictGuard() Option {
	return optionFunc(func(c *config) error {
		c.strictGuard = true
		return nil
	})
}

// Coalescing is the bound of WithCoalescing: how many concurrent
// ProcessMessage calls may share one transaction, and how long the first of
// them waits for the others.
type Coalescing struct {
	// Max is the most messages in one transaction, from 2 to
	// MaxBatchSize. A group closes as soon as it has Max members.
	Max int
	// Wait is how long a group stays open for more members after its
	// first arrived, from 1µs to 1s. It is latency every coalesced
	// message may pay.
	Wait time.Duration
	// Savepoints puts each message's claim and handler under a savepoint
	// of its own: a handler's failure rolls back to it — the claim with
	// the effect — and the group goes on in the same transaction without
	// that message, so no other handler runs again. It costs three
	// statements per message (SAVEPOINT, its own claim, RELEASE) where the
	// optimistic default claims the whole group in one statement and
	// spends more only when a handler fails. Default is false.
	Savepoints bool
	// LockWait bounds how long a handler in a group may wait for a lock
	// (a row another transaction holds) before its message leaves the
	// group and runs in a transaction of its own, with no such bound,
	// while the rest of the group goes on without it. A group holds every
	// lock its handlers took until its COMMIT, so two groups that touch
	// the same hot rows in opposite orders deadlock, and Postgres finds a
	// deadlock only after deadlock_timeout (1s by default): the bound
	// turns that second into LockWait, and moves the messages on hot rows
	// out of the groups. It is set with SET LOCAL lock_timeout, once per
	// group, on a dialect whose lock timeout lasts until the end of the
	// transaction (Postgres): zero is DefaultLockWait there and no bound
	// elsewhere (InnoDB finds deadlocks at once; SQLite has one writer);
	// a negative LockWait sets no bound. A positive LockWait on another
	// dialect is refused. A handler that sets lock_timeout itself sets it
	// for the handlers after it in the group too.
	LockWait time.Duration
}

// LockWaitOn returns the bound c's groups set on their lock waits on
// dialect d: c.LockWait, DefaultLockWait for zero, or 0 — no bound — when
// c.LockWait is negative or d's lock timeout outlives a transaction (it has
// a dialect.LockTimeoutResetter, or none at all). A positive c.LockWait on
// such a d is an error.
func (c Coalescing) LockWaitOn(d dialect.Dialect) (time.Duration, error) {
	if c.LockWait < 0 {
		return 0, nil
	}
	if _, resets := d.(dialect.LockTimeoutResetter); !resets && d.LockTimeoutSQL(time.Second) != "" {
		if c.LockWait == 0 {
			return DefaultLockWait, nil
		}
		return c.LockWait, nil
	}
	if c.LockWait > 0 {
		return 0, fmt.Errorf("idempotent: WithCoalescing: LockWait %v: the %s dialect cannot bound lock waits for one transaction", c.LockWait, d.Name())
	}
	return 0, nil
}

// DefaultLockWait is Coalescing.LockWait's bound where the dialect can set
// one for a transaction (Postgres).
const DefaultLockWait = 50 * time.Millisecond

// WithCoalescing makes concurrent ProcessMessage calls (and WrapMessage's,
// and so every adapter's per-message workers) share transactions: calls
// arriving within c.Wait of the first, up to c.Max of them, run in one
// transaction on one connection — one BEGIN, their claims in one statement
// in key order (as ProcessMessages claims a batch; with c.Savepoints, one
// claim per message, in key order), each new message's
// handler on its own caller's goroutine, one at a time (so the *sql.Tx is
// never used concurrently, and a handler's panic and context values stay its
// caller's), one COMMIT — and each call returns its own outcome only after
// that COMMIT. Duplicates in a group run no handler. A call left alone when
// the wait ends runs as it would without the option.
//
// A handler's failure fails its own message only. By default the design
// is optimistic, with no savepoints: the failure (an error, a panic, a
// guard violation, or the caller's context ending before the COMMIT) rolls
// the whole transaction back, and the group runs again without that
// message. The others' handlers therefore run again: nothing of them had
// committed, so running them again is as safe as a retry is — but work a
// handler does outside the transaction (a call to another service) happens
// again too. With c.Savepoints a handler's error or panic rolls back to a
// savepoint taken before it instead, and the others do not run again; a
// caller whose context ends after its handler ran still costs a re-run.
// A failure of the transaction itself (a serialization failure, a deadlock,
// a lost connection, a COMMIT whose answer was lost) is retried for the
// whole group under the retry policy; a lost COMMIT that landed makes every
// message of the group Duplicate on the retry. A handler whose lock wait ran
// past c.LockWait is not a failure: its message leaves the group and runs
// in a transaction of its own, while the group goes on without it. A caller whose context ends
// before the COMMIT starts gets the context's error, and its work is rolled
// back with the group's attempt; once the COMMIT has started the caller
// waits for it. A claim that fails for good (ErrClaimBusy under
// WithLockTimeout, ErrNoPartition, the retention fence) sends every message
// of the group back to a transaction of its own, so each gets its own
// outcome. The autocommit guard, the strict guard (which then checks after
// every handler; a handler that left the transaction fails the whole group
// with ErrAutocommit), the lock timeout, the retention fence and the
// pre-check work as without it. The group's own statements (BEGIN, the
// claims, COMMIT) run with no caller's context, so a caller that leaves
// does not cut them short: bound the claim's lock waits with
// WithLockTimeout. A handler that swallows a database error on
// a database where that aborts the transaction (Postgres) fails the group's
// COMMIT, and with it every message of the group.
//
// It pays where several calls are in flight at once (a consumer with
// several workers): every message of a group shares BEGIN, the claim and
// COMMIT, and each may wait up to Wait for the group to close (a group of
// one waits the whole Wait). ProcessMessageTx and the batch entry points
// are not coalesced; the Kafka per-record consumer coalesces its records
// with their offset advances (see package kafka). docs/performance.md
// says when to use it and what it costs. Default is off: one transaction
// per call.
func WithCoalescing(c Coalescing) Option {
	return optionFunc(func(cfg *config) error {
		switch {
		case c.Max < 2 || c.Max > MaxBatchSize:
			return fmt.Errorf("idempotent: WithCoalescing: Max is %d, want 2 to %d", c.Max, MaxBatchSize)
		case c.Wait < time.Microsecond || c.Wait > time.Second:
			return fmt.Errorf("idempotent: WithCoalescing: Wait is %v, want 1µs to 1s", c.Wait)
		case c.LockWait > time.Minute:
			return fmt.Errorf("idempotent: WithCoalescing: LockWait is %v, want at most a minute (or 0 for the default, negative for none)", c.LockWait)
		}
		cfg.coalesce = c
		return nil
	})
}
