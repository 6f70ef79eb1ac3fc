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
// WithLockTimeout, WithObserver, WithStrictGuard, WithSeen, WithCoalescing,
// WithOrdering) and is accepted by New only: given to NewClaimTable it
// does not compile.
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
	ordering    *Ordering
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
	// statements per message (SAVEPOINT, its claim, RELEASE) where the
	// optimistic default sends its claim alone, plus one statement per
	// group (its fence), and spends more only when a handler fails; on a
	// dialect.StatementJoiner (Postgres) a message's RELEASE and the next
	// message's SAVEPOINT go as one, so it costs one round trip per
	// message more than the optimistic default. On a
	// dialect without a transaction fence (dialect.TxFencer: MySQL,
	// MariaDB, SQLite) the optimistic design runs with savepoints too, the
	// savepoint's RELEASE being the proof that a handler left the
	// transaction whole; Config().Coalescing still reports the Coalescing
	// as given. Default is false.
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
// transaction on one connection — one BEGIN, then the messages in key
// order, each claimed just before its own handler runs, on its own
// caller's goroutine, one at a time (so the *sql.Tx is never used
// concurrently, and a handler's panic and context values stay its
// caller's), one COMMIT — and each call returns its own outcome only after
// that COMMIT. Duplicates in a group run no handler. A call left alone
// when the wait ends runs as it would without the option.
//
// A message's claim is never in the transaction before its handler is
// about to run, and before it sends the next claim, and before COMMIT, the
// Middleware proves the transaction is still the group's own: in the
// optimistic design (the default) on Postgres, by a fence — the
// transaction is marked with a random token before the first handler, and
// each later claim, and a check before COMMIT, fails outside the
// transaction so marked (dialect.TxFencer); with savepoints (c.Savepoints,
// and the optimistic design on MySQL, MariaDB and SQLite, which have no
// fence), by the RELEASE of the message's savepoint after its handler.
//
// What a handler can do to its group, and what it costs:
//
//   - It fails (returns an error, panics, leaves the group by a
//     guard violation, or its caller's context ends before the COMMIT
//     starts): its message fails alone with that error (the panic reaches
//     its caller after the rollback). Optimistic: the transaction rolls
//     back and the group runs again without it, so the others' handlers run
//     again — safe, nothing of theirs had committed, but work a handler
//     does outside the transaction (a call to another service) happens
//     again too. With savepoints: it is rolled back to its savepoint and
//     the others go on; a caller whose context ends after its handler ran
//     still costs a re-run.
//   - It hangs past its context: the group stops waiting for it when its
//     caller's context ends; the transaction is rolled back (once the
//     statement it has in flight, if any, returns) and the group runs
//     again without it, in either design; its caller gets the context's
//     error when the handler returns.
//   - It ends or breaks the transaction — its own tx.Commit or tx.Rollback,
//     a COMMIT or ROLLBACK statement (also inside a multi-statement string),
//     a statement MySQL commits implicitly, an error it swallows after
//     which Postgres aborted the transaction or InnoDB rolled it back (a
//     deadlock) — and returns nil: the middleware's next statement finds
//     it, before any other message is claimed outside the transaction. Its
//     message fails alone with an error matching ErrAutocommit, and every
//     other message runs again in a new transaction of the group. When the
//     transaction may have committed under it, the error says so loudly:
//     its claim committed with the part of its effect that ran before, the
//     messages before it in the group committed too (they come back
//     Duplicate: their effects exist once), and statements it ran after
//     committed one by one. With savepoints on Postgres, a swallowed error
//     that only aborted the transaction is rolled back to the message's
//     savepoint and fails it alone, and nothing runs again. A swallowed
//     error that neither aborts nor rolls back the transaction — any on
//     SQLite, and on MySQL and MariaDB any but a deadlock (or a lock wait
//     timeout under innodb_rollback_on_timeout), whose statement alone is
//     rolled back — leaves it the group's: the handler's other work commits
//     with the group, as it would alone. Through
//     GuardConnector most of these never reach the database: tx.Commit and
//     tx.Rollback roll the transaction back and fail with ErrAutocommit,
//     transaction-control and implicitly committing statements are refused,
//     and on MySQL and MariaDB a statement after a swallowed deadlock is
//     refused (see GuardConnector) — the message fails alone and nothing
//     of it committed.
//   - It is a deadlock victim or meets a serialization failure, and
//     returns that error: the transaction's own failure, retried for the
//     whole group under the retry policy.
//   - It writes through the *sql.DB with its context: refused by
//     GuardConnector (its message fails alone); without the guard the
//     write commits on its own, apart from the group, as it would alone.
//   - It waits for a lock past c.LockWait: not a failure; its message
//     leaves the group and runs in a transaction of its own, while the
//     group goes on without it.
//
// A claim that fails for good (ErrClaimBusy under WithLockTimeout,
// ErrNoPartition, the retention horizon) concerns its message only: it
// runs alone, and the group goes on without it (optimistic: runs again
// without it). A failure of the transaction itself (a serialization
// failure, a deadlock, a lost connection, a COMMIT whose answer was lost)
// is retried for the whole group under the retry policy; a lost COMMIT
// that landed makes every message of the group Duplicate on the retry. A
// COMMIT that fails for any other reason (a deferred constraint) sends
// every message of the group to a transaction of its own, so each gets
// its own outcome. A caller whose context ends before the COMMIT starts
// gets the context's error, and its work is rolled back with the group's
// attempt; once the COMMIT has started the caller waits for it. The
// autocommit guard, the strict guard (which then reads the transaction id
// after the first claim, after every handler and before COMMIT; a handler
// that left the transaction fails alone, loudly), the lock timeout, the
// retention fence and the pre-check work as without it. The group's own
// statements (BEGIN, the claims, COMMIT) run with no caller's context, so
// a caller that leaves does not cut them short: bound the claim's lock
// waits with WithLockTimeout.
//
// It pays where several calls are in flight at once (a consumer with
// several workers): every message of a group shares BEGIN and COMMIT, and
// each may wait up to Wait for the group to close (a group of one waits the
// whole Wait). ProcessMessageTx and the batch entry points are not
// coalesced; the Kafka per-record consumer coalesces its records with
// their offset advances (see package kafka). docs/performance.md says when
// to use it and what it costs. Default is off: one transaction per call.
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
