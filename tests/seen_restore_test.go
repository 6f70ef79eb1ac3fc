package tests

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idempgx"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/tests/internal/pgcluster"
)

// The pre-check against every way a Postgres database is restarted,
// restored or copied (docs/operations.md, "Pre-check and restores"). Each
// test runs throwaway clusters of its own on ports of their own (never the
// shared server), and consumers on the database/sql path (lib/pq) and on
// the pgx path (idempgx), sharing one pre-check store — a SeenLRU standing
// for one Redis — with the processes that run before and after. A message
// applied after the point a restore goes back to, and recorded in the
// pre-check, must be applied again in the restored database, not answered
// Duplicate: its claim went with what the restore lost.

// seenKinds are the two paths every test delivers through.
var seenKinds = []string{"database/sql", "pgx"}

// seenClock is a Middleware clock (WithClock) that a test moves: the
// pre-check's scope ages by it, so that no test waits for it.
type seenClock struct {
	mu  sync.Mutex
	now time.Time
}

func newSeenClock() *seenClock {
	return &seenClock{now: time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *seenClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Add moves the clock on by d.
func (c *seenClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// scopeAge is how long a Middleware answers from the scope it read.
const scopeAge = 5 * time.Second

// seenApp is one process of a consumer on a cluster: a database/sql
// Middleware (consumer orders-sql) and an idempgx Middleware (orders-pgx)
// on one claim table, both with the pre-check seen and the clock.
type seenApp struct {
	t     *testing.T
	where string // "production", "the restored database", …
	db    *sql.DB
	sql   *idempotent.Middleware
	pgx   *idempgx.Middleware
	clock *seenClock
}

// seenRetry rides out a server that restarts under a delivery.
var seenRetry = idempotent.RetryPolicy{MaxAttempts: 100, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}

// newSeenApp starts a process of the consumer on c: it creates the
// effects and claim tables if they are missing.
func newSeenApp(t *testing.T, where string, c *pgcluster.Cluster, seen idempotent.Seen, clock *seenClock) *seenApp {
	t.Helper()
	return newSeenAppOn(t, where, c.DSN("seen"), seen, clock)
}

// newSeenAppOn is newSeenApp on dsn.
func newSeenAppOn(t *testing.T, where, dsn string, seen idempotent.Seen, clock *seenClock) *seenApp {
	t.Helper()
	ctx := context.Background()
	a := &seenApp{t: t, where: where, clock: clock}
	a.db = openPlain(t, dsn)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := a.db.Exec("CREATE TABLE IF NOT EXISTS effects (id text PRIMARY KEY, n int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if a.sql, err = idempotent.New(a.db, postgres.New(), "orders-sql", idempotent.WithSeen(seen),
		idempotent.WithClock(clock.Now), idempotent.WithRetry(seenRetry)); err != nil {
		t.Fatal(err)
	}
	if err := a.sql.EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if a.pgx, err = idempgx.New(pool, "orders-pgx", idempgx.WithSeen(seen),
		idempgx.WithClock(clock.Now), idempgx.WithRetry(seenRetry)); err != nil {
		t.Fatal(err)
	}
	return a
}

// openPlain opens a lib/pq pool on dsn, closed in Cleanup.
func openPlain(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(2)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// effectID is the effects row of key delivered through kind.
func effectID(kind, key string) string { return kind + "/" + key }

// deliver delivers key through kind; the effect adds one to its row.
// hold, if not nil, runs in the handler after the effect was written.
func (a *seenApp) deliver(kind, key string, hold func()) (idempotent.Outcome, error) {
	ctx := context.Background()
	const q = "INSERT INTO effects (id, n) VALUES ($1, 1) ON CONFLICT (id) DO UPDATE SET n = effects.n + 1"
	msg := idempotent.Message{Key: key}
	if kind == "pgx" {
		return a.pgx.ProcessMessage(ctx, msg, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, q, effectID(kind, key)); err != nil {
				return err
			}
			if hold != nil {
				hold()
			}
			return nil
		})
	}
	return a.sql.ProcessMessage(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, q, effectID(kind, key)); err != nil {
			return err
		}
		if hold != nil {
			hold()
		}
		return nil
	})
}

// expect delivers each of keys through both paths and reports an outcome
// other than want: "<where>'s delivery of <key> (<kind>): <outcome>".
func (a *seenApp) expect(want idempotent.Outcome, keys ...string) {
	a.t.Helper()
	for _, kind := range seenKinds {
		for _, k := range keys {
			out, err := a.deliver(kind, k, nil)
			if err != nil {
				a.t.Errorf("%s's delivery of %s (%s): %v", a.where, k, kind, err)
			} else if out != want {
				a.t.Errorf("%s's delivery of %s (%s): %v, want %v", a.where, k, kind, out, want)
			}
		}
	}
}

// wantOnce reports each of keys whose effect is not in a's database
// exactly once, on both paths.
func (a *seenApp) wantOnce(keys ...string) {
	a.t.Helper()
	for _, kind := range seenKinds {
		for _, k := range keys {
			var n int
			if err := a.db.QueryRow("SELECT coalesce((SELECT n FROM effects WHERE id = $1), 0)", effectID(kind, k)).Scan(&n); err != nil {
				a.t.Fatal(err)
			}
			if n != 1 {
				a.t.Errorf("%s (%s): effect applied %d times in %s, want once", k, kind, n, a.where)
			}
		}
	}
}

// scope returns the scope kind's Middleware reads now.
func (a *seenApp) scope(kind string) (idempotent.SeenScope, error) {
	if kind == "pgx" {
		return a.pgx.Core().SeenScope(context.Background())
	}
	return a.sql.SeenScope(context.Background())
}

// mustScope is scope, failing the test on an error.
func (a *seenApp) mustScope(kind string) idempotent.SeenScope {
	a.t.Helper()
	s, err := a.scope(kind)
	if err != nil {
		a.t.Fatalf("%s: SeenScope (%s): %v", a.where, kind, err)
	}
	return s
}

// scopeField returns the value after word in a Postgres scope's name
// ("system", "timeline", "start", "table", "storage", "database").
func scopeField(s idempotent.SeenScope, word string) string {
	f := strings.Fields(s.Database)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == word {
			return f[i+1]
		}
	}
	return ""
}

// putInPlace stops production and starts restored on production's port,
// as a restore puts a backup in place of the lost data directory.
func putInPlace(t *testing.T, production, restored *pgcluster.Cluster, settings ...string) {
	t.Helper()
	if err := production.Stop(); err != nil {
		t.Fatal(err)
	}
	restored.Port = production.Port
	if err := restored.Start(context.Background(), settings...); err != nil {
		t.Fatal(err)
	}
}

// newLRU is the pre-check store every process of a test shares.
func newLRU(t *testing.T) *idempotent.SeenLRU {
	t.Helper()
	lru, err := idempotent.NewSeenLRU(1000)
	if err != nil {
		t.Fatal(err)
	}
	return lru
}

// seenProduction is where each Postgres test starts: a throwaway cluster,
// a process of the consumer on it, and the pre-check store that every
// process of the test shares.
type seenProduction struct {
	parent string
	lru    *idempotent.SeenLRU
	c      *pgcluster.Cluster
	app    *seenApp
}

// newSeenProduction makes production; settings, if not nil, returns the
// server's settings once its directory exists.
func newSeenProduction(t *testing.T, settings func(c *pgcluster.Cluster) []string) *seenProduction {
	t.Helper()
	bin := failoverBin(t)
	p := &seenProduction{parent: t.TempDir(), lru: newLRU(t)}
	c, err := pgcluster.New(context.Background(), bin, pgcluster.Options{Parent: p.parent, Prefix: "production-", TCP: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Remove)
	var extra []string
	if settings != nil {
		extra = settings(c)
	}
	if err := c.Start(context.Background(), extra...); err != nil {
		t.Fatal(err)
	}
	p.c = c
	p.app = newSeenApp(t, "production", c, p.lru, newSeenClock())
	return p
}

// backup takes a base backup of production (pgcluster.NewBackup).
func (p *seenProduction) backup(t *testing.T, prefix string) *pgcluster.Cluster {
	t.Helper()
	b, err := pgcluster.NewBackup(context.Background(), p.c, pgcluster.Options{Parent: p.parent, Prefix: prefix, TCP: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Remove)
	return b
}

// restore runs a restore and checks what it did: "kept" is applied, then
// take makes what the restore goes back to, "lost" and "lost-running" are
// applied, and the restore func take returned puts it back and returns the
// restored cluster. A process started after the restore applies "lost"
// again and finds "kept" Duplicate; the process that ran on through the
// restore does the same for "lost-running" once the scope it read is
// scopeAge old (its clock is moved: nothing sleeps). It returns the scopes
// before and after the restore.
func (p *seenProduction) restore(t *testing.T, take func() (restore func() *pgcluster.Cluster)) (before, after idempotent.SeenScope) {
	t.Helper()
	p.app.expect(idempotent.Applied, "kept")
	put := take()
	p.app.expect(idempotent.Applied, "lost", "lost-running") // lost with the restore
	before = p.app.mustScope("database/sql")
	restored := put()

	fresh := newSeenApp(t, "the restored database", restored, p.lru, newSeenClock())
	fresh.expect(idempotent.Applied, "lost")
	fresh.expect(idempotent.Duplicate, "kept")
	p.app.where = "the restored database (a process that ran on)"
	p.app.clock.Add(scopeAge)
	p.app.expect(idempotent.Applied, "lost-running")
	p.app.expect(idempotent.Duplicate, "kept")
	fresh.wantOnce("lost", "lost-running", "kept")

	after = fresh.mustScope("database/sql")
	t.Logf("before the restore: %s\nafter it:           %s", before.Database, after.Database)
	if s := fresh.mustScope("pgx"); s.Database != after.Database {
		t.Errorf("the pgx path reads %q, the database/sql path %q: want one name", s.Database, after.Database)
	}
	return before, after
}

// inPlace is a restore func that puts restored in production's place
// (putInPlace).
func (p *seenProduction) inPlace(t *testing.T, restored *pgcluster.Cluster) func() *pgcluster.Cluster {
	return func() *pgcluster.Cluster {
		putInPlace(t, p.c, restored)
		return restored
	}
}

// TestSeenBaseBackupRestored: a base backup restored and started as it is
// (crash recovery from its backup label, as a volume snapshot starts
// too) keeps the system identifier, the timeline and every OID. A message
// applied after the backup was taken, recorded in the pre-check and lost
// with the restore is applied again in the restored database: by a process
// started after the restore, and by the process that ran on through it
// once the scope it read is 5 seconds old.
func TestSeenBaseBackupRestored(t *testing.T) {
	p := newSeenProduction(t, nil)
	before, after := p.restore(t, func() func() *pgcluster.Cluster {
		return p.inPlace(t, p.backup(t, "backup-"))
	})
	for _, f := range []string{"system", "timeline", "table", "database"} {
		if scopeField(before, f) != scopeField(after, f) {
			t.Errorf("the restore changed the %s: %q, %q (the test means a backup started as it is)", f, before.Database, after.Database)
		}
	}
}

// TestSeenPhysicalCloneSharesNoScope: a staging server cloned from
// production (a base backup started as a server of its own) shares the
// system identifier, the timeline and every OID with it, and one pre-check
// store. Neither answers for the other: a message staging applied is
// applied in production too, and the other way round.
func TestSeenPhysicalCloneSharesNoScope(t *testing.T) {
	p := newSeenProduction(t, nil)
	p.app.expect(idempotent.Applied, "before-clone")
	clone := p.backup(t, "staging-")
	if err := clone.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	staging := newSeenApp(t, "staging", clone, p.lru, newSeenClock())

	staging.expect(idempotent.Applied, "order-1")
	p.app.expect(idempotent.Applied, "order-1")
	p.app.expect(idempotent.Applied, "order-2")
	staging.expect(idempotent.Applied, "order-2")
	staging.expect(idempotent.Duplicate, "before-clone") // its claim was copied
	p.app.wantOnce("order-1", "order-2", "before-clone")
	staging.wantOnce("order-1", "order-2", "before-clone")

	prod, stag := p.app.mustScope("database/sql"), staging.mustScope("database/sql")
	t.Logf("production: %s\nstaging:    %s", prod.Database, stag.Database)
	if prod == stag || scopeField(prod, "system") != scopeField(stag, "system") || scopeField(prod, "table") != scopeField(stag, "table") {
		t.Errorf("production %q, staging %q: want one system identifier and table OID, and two scopes", prod.Database, stag.Database)
	}
}

// TestSeenServerRestart: a restart gives a new scope (the pre-check is
// cold after it). A process that runs on through the restart and sees a
// connection lost — a transaction in flight when the server shut down —
// forgets the scope at once, its clock standing still: it never answers
// from the old scope again.
func TestSeenServerRestart(t *testing.T) {
	p := newSeenProduction(t, nil)
	app := p.app
	app.where = "the restarted server"
	app.expect(idempotent.Applied, "before")
	before := map[string]idempotent.SeenScope{}
	for _, kind := range seenKinds {
		before[kind] = app.mustScope(kind)
	}

	// One transaction per path in flight, held after its effect, while the
	// server restarts under it.
	var held, done sync.WaitGroup
	release := make(chan struct{})
	errs := make([]error, len(seenKinds))
	outs := make([]idempotent.Outcome, len(seenKinds))
	for i, kind := range seenKinds {
		held.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			var once sync.Once
			outs[i], errs[i] = app.deliver(kind, "in-flight", func() {
				once.Do(func() {
					held.Done()
					<-release
				})
			})
		}()
	}
	held.Wait()
	if err := p.c.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := p.c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(release)
	done.Wait()
	for i, kind := range seenKinds {
		if errs[i] != nil || outs[i] != idempotent.Applied {
			t.Fatalf("the delivery in flight across the restart (%s): %v, %v; want applied after a retry", kind, outs[i], errs[i])
		}
	}

	for _, kind := range seenKinds {
		after, err := app.scope(kind)
		t.Logf("%s: before the restart %s\n%s: after it %s (%v)", kind, before[kind].Database, kind, after.Database, err)
		// The old scope is gone: the new one, or none while the pool
		// still meets a connection of the old server.
		if err == nil && (after == before[kind] || scopeField(after, "start") == scopeField(before[kind], "start")) {
			t.Errorf("%s: the scope after a lost connection, with the clock standing still, is %q; want a new start", kind, after.Database)
		}
	}
	app.expect(idempotent.Duplicate, "before", "in-flight")
	app.wantOnce("before", "in-flight")
	fresh := newSeenApp(t, "the restarted server (a new process)", p.c, p.lru, newSeenClock())
	if s := fresh.mustScope("database/sql"); s == before["database/sql"] {
		t.Errorf("a process started after the restart reads the scope of before it: %q", s.Database)
	}
}

// TestSeenPointInTimeRecovery: a base backup recovered to a restore point
// from the WAL archive (recovery.signal, recovery_target_name) and
// promoted: a new timeline and a new start. A message applied after the
// restore point is applied again.
func TestSeenPointInTimeRecovery(t *testing.T) {
	var archive string
	p := newSeenProduction(t, func(c *pgcluster.Cluster) []string {
		var err error
		if archive, err = c.Mkdir("archive"); err != nil {
			t.Fatal(err)
		}
		return []string{"archive_mode=on", "archive_command=cp %p " + archive + "/%f"}
	})
	backup := p.backup(t, "pitr-")
	db := p.app.db
	before, after := p.restore(t, func() func() *pgcluster.Cluster {
		if _, err := db.Exec("SELECT pg_create_restore_point('before-lost')"); err != nil {
			t.Fatal(err)
		}
		return func() *pgcluster.Cluster {
			// Archive the WAL holding all of it, then recover to the
			// restore point.
			var last string
			if err := db.QueryRow("SELECT pg_walfile_name(pg_switch_wal())").Scan(&last); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the archiver to archive "+last, func() (bool, error) {
				var archived sql.NullString
				err := db.QueryRow("SELECT last_archived_wal FROM pg_stat_archiver").Scan(&archived)
				return archived.Valid && archived.String >= last, err
			})
			if err := backup.Configure("restore_command = 'cp "+filepath.Join(archive, "%f")+" %p'",
				"recovery_target_name = 'before-lost'", "recovery_target_action = 'promote'"); err != nil {
				t.Fatal(err)
			}
			if err := backup.Touch("recovery.signal"); err != nil {
				t.Fatal(err)
			}
			putInPlace(t, p.c, backup)
			waitFor(t, "the recovery to reach its target and promote", func() (bool, error) {
				var inRecovery bool
				err := db.QueryRow("SELECT pg_is_in_recovery()").Scan(&inRecovery)
				return err == nil && !inRecovery, nil
			})
			return backup
		}
	})
	if scopeField(after, "timeline") == scopeField(before, "timeline") {
		t.Errorf("after a point-in-time recovery: %q, want a new timeline", after.Database)
	}
}

// TestSeenSnapshotRestored: an atomic snapshot of the running server's
// volume — what the disk held at one instant, which is what a SIGKILL
// leaves — restored and started: crash recovery, with the system
// identifier, the timeline and every OID of the original. A message
// applied after the snapshot is applied again.
func TestSeenSnapshotRestored(t *testing.T) {
	p := newSeenProduction(t, nil)
	before, after := p.restore(t, func() func() *pgcluster.Cluster {
		if err := p.c.Kill(); err != nil { // the snapshot's instant
			t.Fatal(err)
		}
		snapshot, err := pgcluster.NewCopy(context.Background(), p.c, pgcluster.Options{Parent: p.parent, Prefix: "snapshot-", TCP: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(snapshot.Remove)
		if err := p.c.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		return p.inPlace(t, snapshot)
	})
	if scopeField(after, "timeline") != scopeField(before, "timeline") || scopeField(after, "table") != scopeField(before, "table") {
		t.Errorf("the snapshot changed the timeline or the table: %q, %q", before.Database, after.Database)
	}
}

// TestSeenLogicalDumpRestored: a dump (pg_dump -Fc) restored into the
// running server, with no restart: with pg_restore --clean, the claim
// table is re-created (a new OID); with TRUNCATE and pg_restore
// --data-only into the existing tables, the claim table gets new storage.
// Either way a message applied after the dump is applied again.
func TestSeenLogicalDumpRestored(t *testing.T) {
	ctx := context.Background()
	for _, how := range []string{"clean", "data-only"} {
		t.Run(how, func(t *testing.T) {
			p := newSeenProduction(t, nil)
			c := p.c
			dump := filepath.Join(c.Dir, "dump.pgc")
			conn := []string{"-h", "127.0.0.1", "-p", fmt.Sprint(c.Port), "-U", "postgres", "-d", "postgres"}
			before, after := p.restore(t, func() func() *pgcluster.Cluster {
				if err := c.Run(ctx, "pg_dump", append(conn, "-Fc", "-f", dump)...); err != nil {
					t.Fatal(err)
				}
				return func() *pgcluster.Cluster {
					args := append(conn, "--clean", "--if-exists", "--single-transaction", dump)
					if how == "data-only" {
						if _, err := p.app.db.Exec("TRUNCATE effects, processed_messages"); err != nil {
							t.Fatal(err)
						}
						args = append(conn, "--data-only", "--single-transaction", dump)
					}
					if err := c.Run(ctx, "pg_restore", args...); err != nil {
						t.Fatal(err)
					}
					return c
				}
			})
			if scopeField(after, "start") != scopeField(before, "start") {
				t.Errorf("the server restarted: %q, %q", before.Database, after.Database)
			}
		})
	}
}

// TestSeenFailoverProcessRunsOn is TestSeenAfterFailover for the process
// that runs on through the failover, on a DSN that follows the writable
// node: once the scope it read is 5 seconds old it reads the new
// primary's, and the message the old primary took with it is applied
// again.
func TestSeenFailoverProcessRunsOn(t *testing.T) {
	p := newReplicationPair(t)
	lru := newLRU(t)
	app := newSeenAppOn(t, "the old primary", p.multiHostDSN(), lru, newSeenClock())
	app.expect(idempotent.Applied, "kept")
	standby := p.open(t, p.standby.DSN("seen-standby"))
	waitFor(t, "the standby to replay the claims of kept", func() (bool, error) {
		var n int
		err := standby.QueryRow("SELECT count(*) FROM processed_messages WHERE message_key = 'kept'").Scan(&n)
		if err != nil && strings.Contains(err.Error(), "does not exist") {
			return false, nil
		}
		return n == 2, err
	})
	p.link.Cut()
	app.expect(idempotent.Applied, "lost") // on the primary alone
	if err := p.primary.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := p.standby.Promote(context.Background()); err != nil {
		t.Fatal(err)
	}
	app.where = "the new primary"
	app.clock.Add(scopeAge)
	app.expect(idempotent.Applied, "lost")
	app.expect(idempotent.Duplicate, "kept")
	app.wantOnce("lost", "kept")
}
