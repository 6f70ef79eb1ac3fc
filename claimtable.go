package idempotent

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/txclaim/idempotent/dialect"
)

// ClaimTable is the claim table of a database apart from any consumer: its
// schema, cleanup, partitions and statistics. Operators' jobs (a cron
// cleanup, a daily partition run, the idempotent CLI) use it without
// naming a consumer; a Middleware's own table is [Middleware.ClaimTable].
// It is safe for concurrent use.
type ClaimTable struct {
	db     *sql.DB
	d      dialect.Dialect
	table  dialect.Table
	ret    retention
	hk     dialect.HorizonKeeper // nil when the dialect keeps no horizon
	policy RetryPolicy
	// owner names, in error messages, what was configured: "ClaimTable",
	// or "Middleware" for a Middleware's table.
	owner string
}

// NewClaimTable returns the claim table of db, speaking dialect d. It takes
// the options that describe the table ([TableOption]), which are the
// Middleware's own: WithTable, WithRetention, WithClockSkew, WithClock,
// WithDailyPartitions and WithRetry (the retry policy of the maintenance
// transactions). Give it the same values as the Middlewares using the
// table. The options that configure a consumer's deliveries
// (WithTxOptions, WithLockTimeout, WithObserver, WithStrictGuard, WithSeen)
// are not TableOptions: given to NewClaimTable they do not compile.
//
// NewClaimTable sends nothing to the database.
func NewClaimTable(db *sql.DB, d dialect.Dialect, opts ...TableOption) (*ClaimTable, error) {
	if db == nil {
		return nil, errors.New("idempotent: NewClaimTable: nil *sql.DB")
	}
	if d == nil {
		return nil, errors.New("idempotent: NewClaimTable: nil dialect")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("idempotent: NewClaimTable: nil option")
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	table, err := dialect.ParseTable(cfg.table)
	if err != nil {
		return nil, fmt.Errorf("idempotent: %w", err)
	}
	if err := checkHorizonName(d, table); err != nil {
		return nil, err
	}
	t := &ClaimTable{db: db, d: d, table: table, ret: retention{retentionConfig: cfg.retention}, policy: cfg.retry, owner: "ClaimTable"}
	t.hk, _ = d.(dialect.HorizonKeeper)
	if cfg.retention.leadDays > 0 {
		p, ok := d.(dialect.Partitioner)
		if !ok {
			return nil, fmt.Errorf("idempotent: WithDailyPartitions: the %s dialect does not support partitions", d.Name())
		}
		if n := len(p.PartitionName(table, time.Unix(0, 0))); n > dialect.MaxIdentifierBytes {
			return nil, fmt.Errorf("idempotent: WithDailyPartitions: table name %q is too long: its partitions' names would be %d bytes, the limit is %d",
				table.Name, n, dialect.MaxIdentifierBytes)
		}
		t.ret.part = p
	}
	return t, nil
}

// ClaimTable returns the claim table the Middleware uses, with its table
// name, retention window, clock-skew margin, clock, partitioned mode and
// retry policy.
func (m *Middleware) ClaimTable() *ClaimTable {
	return &ClaimTable{db: m.db, d: m.d, table: m.table, ret: m.ret, hk: m.hk, policy: m.run.policy, owner: "Middleware"}
}

// Name returns the table's name as configured, unquoted.
func (t *ClaimTable) Name() string { return t.table.String() }

// Retention returns the retention window.
func (t *ClaimTable) Retention() time.Duration { return t.ret.window }

// Partitioned reports whether the table is configured as partitioned by
// event day (WithDailyPartitions).
func (t *ClaimTable) Partitioned() bool { return t.ret.part != nil }

func (t *ClaimTable) now() time.Time { return t.ret.clock() }

// keepAfter returns the time before which claims may be removed: the
// retention window plus the clock-skew margin before now.
func (t *ClaimTable) keepAfter(now time.Time) time.Time {
	return now.Add(-t.ret.window - t.ret.skew)
}

// EnsureSchema creates the claim table and its processed_at index if they do
// not exist (the guide's Step 1). It is safe to call from many processes at
// once and on every start, while other processes claim: it first reads the
// database's catalog, in a read-only transaction that takes no lock on the
// claim table, and when everything exists it sends no DDL at all, so it
// never waits behind an open claim nor makes new claims wait behind it.
// When partitioned (WithDailyPartitions) it creates the partitioned table
// and the partitions MaintainPartitions would create, but drops none. It
// fails, naming the table, when an existing table is partitioned and the
// ClaimTable is not, or the other way round.
//
// What is missing is created under a schema lock that serialises
// EnsureSchema between processes, and every lock its DDL needs on the claim
// table is waited for at most PartitionLockTimeout (on SQLite, for the
// connection's busy timeout): creating an index, or a partition, on a table
// that open claims use waits for them to end, and new claims queue behind
// the waiting DDL. When the wait runs out, EnsureSchema gives up with an
// error matching ErrSchemaLockTimeout, having changed nothing it had not
// finished; it is safe to run again.
//
// If the dialect implements dialect.ServerChecker, EnsureSchema first checks
// that the database is one the dialect speaks: a dialect used with another
// database's driver fails here with an error matching
// dialect.ErrWrongDatabase. A dialect that does not implement
// dialect.SchemaInspector has its SchemaSQL run every time.
func (t *ClaimTable) EnsureSchema(ctx context.Context) error {
	return t.ensureSchema(ctx, nil)
}

// ensureSchema is EnsureSchema; probe, if set, runs in the transaction that
// checks the schema, after the server check.
func (t *ClaimTable) ensureSchema(ctx context.Context, probe func(context.Context, *sql.Tx) error) error {
	insp, ok := t.d.(dialect.SchemaInspector)
	if !ok {
		return t.ensureSchemaBlind(ctx, probe)
	}
	objs := dialect.ClaimTableObjects(t.d, insp, t.table, t.ret.part != nil)
	missing, err := t.checkSchema(ctx, insp, objs, probe)
	if err != nil {
		return fmt.Errorf("idempotent: ensure schema of %s: %w", t.table, err)
	}
	if len(missing) > 0 {
		if err := t.createMissing(ctx, insp, objs, missing); err != nil {
			return err
		}
	}
	return t.afterSchema(ctx)
}

// EnsureSchema creates the claim table and its processed_at index if they do
// not exist (the guide's Step 1): it is the EnsureSchema of the
// Middleware's ClaimTable and, with WithStrictGuard, also checks that the
// server can run the strict guard's transaction id query. It is safe to
// call from many processes at once and on every start: when everything
// exists it sends no DDL, and DDL it does need gives up after
// PartitionLockTimeout with an error matching ErrSchemaLockTimeout rather
// than stall the claims queued behind it (see ClaimTable.EnsureSchema). In
// partitioned mode (WithDailyPartitions) it creates the partitioned table
// and the partitions MaintainPartitions would create, but drops none. It
// fails, naming the table, when an existing table is partitioned and the
// Middleware is not, or the other way round.
//
// If the dialect implements dialect.ServerChecker, EnsureSchema first checks
// that the database is one the dialect speaks: a dialect used with another
// database's driver fails here with an error matching
// dialect.ErrWrongDatabase.
func (m *Middleware) EnsureSchema(ctx context.Context) error {
	var probe func(context.Context, *sql.Tx) error
	if m.txidSQL != "" {
		probe = m.probeTxID
	}
	if err := m.ClaimTable().ensureSchema(ctx, probe); err != nil {
		return err
	}
	if m.ord != nil {
		return m.ensureOrderSchema(ctx)
	}
	return nil
}

// txQuery returns a dialect.QueryFunc that runs on tx.
func txQuery(tx *sql.Tx) dialect.QueryFunc {
	return func(ctx context.Context, query string, args ...any) (string, error) {
		var s sql.NullString
		err := tx.QueryRowContext(ctx, query, args...).Scan(&s)
		return s.String, err
	}
}

// schemaSQL returns the statements EnsureSchema runs for the mode.
func (t *ClaimTable) schemaSQL() []string {
	var stmts []string
	if t.ret.part != nil {
		stmts = t.ret.part.PartitionedSchemaSQL(t.table)
	} else {
		stmts = t.d.SchemaSQL(t.table)
	}
	if t.hk != nil {
		for _, h := range t.hk.HorizonSchemaSQL(t.table) {
			if !slices.Contains(stmts, h) {
				stmts = append(stmts[:len(stmts):len(stmts)], h)
			}
		}
	}
	return stmts
}

// afterSchema checks that the claim table has the mode's layout and, in
// partitioned mode, creates the missing partitions.
func (t *ClaimTable) afterSchema(ctx context.Context) error {
	p, ok := t.d.(dialect.Partitioner)
	if !ok {
		return nil
	}
	exists, partitioned, err := t.tableKind(ctx, p)
	if err != nil {
		return err
	}
	switch {
	case !exists:
		return fmt.Errorf("%w: %s", ErrNoClaimTable, t.table)
	case partitioned && t.ret.part == nil:
		return fmt.Errorf("idempotent: claim table %s is partitioned, but the %s was not given WithDailyPartitions", t.table, t.owner)
	case !partitioned && t.ret.part != nil:
		return fmt.Errorf("idempotent: WithDailyPartitions: claim table %s exists and is not partitioned; migrate it (or drop it) first", t.table)
	case !partitioned:
		return nil
	}
	// maintain lists the partitions first and creates only the missing
	// ones, each under PartitionLockTimeout.
	if _, err = t.maintain(ctx, false); err != nil && t.d.Classify(err).Kind == dialect.KindLockTimeout {
		return t.schemaLockError("create a partition", PartitionLockTimeout.String(), err)
	}
	return err
}

func (t *ClaimTable) tableKind(ctx context.Context, p dialect.Partitioner) (exists, partitioned bool, err error) {
	q, args := p.TableKindSQL(t.table)
	if err := t.db.QueryRowContext(ctx, q, args...).Scan(&exists, &partitioned); err != nil {
		return false, false, fmt.Errorf("idempotent: inspect claim table %s: %w", t.table, err)
	}
	return exists, partitioned, nil
}

// tableError turns an undefined-table failure into ErrNoClaimTable.
func (t *ClaimTable) tableError(err error) error {
	if err != nil && t.d.Classify(err).Kind == dialect.KindUndefinedTable {
		return fmt.Errorf("%w: %s: %w", ErrNoClaimTable, t.table, err)
	}
	return err
}

// ConsumerStats is one consumer's claims in the claim table.
type ConsumerStats struct {
	// Consumer is the consumer's name.
	Consumer string
	// Claims is how many claims the consumer has in the table.
	Claims int64
	// Oldest and Newest are the processed_at of the consumer's oldest and
	// newest claim.
	Oldest, Newest time.Time
}

// Stats counts the claims of every consumer with claims in the table, with
// the oldest and newest, ordered by consumer name. It reads every row: on a
// large table it takes as long as a full scan. A missing table is an error
// matching ErrNoClaimTable; the dialect must implement dialect.StatsReader.
func (t *ClaimTable) Stats(ctx context.Context) ([]ConsumerStats, error) {
	s, ok := t.d.(dialect.StatsReader)
	if !ok {
		return nil, fmt.Errorf("idempotent: Stats: the %s dialect does not support table statistics", t.d.Name())
	}
	rows, err := t.db.QueryContext(ctx, s.StatsSQL(t.table))
	if err != nil {
		return nil, fmt.Errorf("idempotent: stats of %s: %w", t.table, t.tableError(err))
	}
	defer rows.Close()
	var out []ConsumerStats
	for rows.Next() {
		var c ConsumerStats
		var oldest, newest int64 // microseconds since the Unix epoch (dialect.StatsReader)
		if err := rows.Scan(&c.Consumer, &c.Claims, &oldest, &newest); err != nil {
			return nil, fmt.Errorf("idempotent: stats of %s: %w", t.table, err)
		}
		c.Oldest, c.Newest = time.UnixMicro(oldest).UTC(), time.UnixMicro(newest).UTC()
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idempotent: stats of %s: %w", t.table, t.tableError(err))
	}
	return out, nil
}
