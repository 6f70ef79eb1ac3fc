package tests

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/tests/internal/pgcluster"
)

// pgbouncerPGXMode is the pgx query execution mode the tests use through
// PgBouncer in transaction pooling mode. pgx's default,
// cache_statement, prepares named statements once per client connection
// and reuses them; behind a transaction-mode pooler the next transaction
// runs on another server connection, where they do not exist. exec sends
// every statement as an unnamed Parse/Bind/Execute in one round trip and
// works with every PgBouncer version; simple_protocol works too.
const pgbouncerPGXMode = "exec"

// pgbouncerPQParams are lib/pq's parameters through PgBouncer:
// binary_parameters=yes sends a statement with arguments in one round trip.
// Without it, lib/pq parses an unnamed statement, waits for the server, and
// binds in a second round trip — outside a transaction the pooler may send
// the second to another server connection.
const pgbouncerPQParams = "binary_parameters=yes"

// startPgBouncer starts a PgBouncer of the test's own in transaction pooling
// mode in front of the test database, stopped in Cleanup. It skips when
// there is no test database, or no pgbouncer binary unless CI is set.
func startPgBouncer(t *testing.T) *pgcluster.PgBouncer {
	t.Helper()
	if pgDSN == "" {
		t.Skip(skipReason)
	}
	bin, err := pgcluster.FindPgBouncer()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("the PgBouncer tests need pgbouncer and CI is set: %v", err)
		}
		t.Skipf("pgbouncer: %v", err)
	}
	u, err := url.Parse(pgDSN)
	if err != nil || u.Scheme == "" {
		t.Skipf("DSN %q is not a URL; the PgBouncer tests need postgres://user@host:port/db", pgDSN)
	}
	port := 5432
	if p := u.Port(); p != "" {
		if port, err = strconv.Atoi(p); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := u.User.Password(); ok {
		t.Skip("the PgBouncer tests use trust authentication; the test database has a password")
	}
	b, err := pgcluster.StartPgBouncer(context.Background(), pgcluster.PgBouncerOptions{
		Bin: bin, Parent: t.TempDir(),
		Host: u.Hostname(), Port: port, Database: strings.TrimPrefix(u.Path, "/"), User: u.User.Username(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgbouncer log:\n%s", b.LogTail())
		}
		b.Stop()
	})
	return b
}

// TestPgBouncerTransactionPooling runs the integration tests that matter in
// production through a PgBouncer in transaction pooling mode — concurrent
// duplicates, a dead holder taken over, a waiting duplicate after a
// rollback, the SERIALIZABLE storm, the lock timeout, the strict guard,
// cleanup's advisory lock and partition maintenance — with lib/pq
// (binary_parameters=yes) and pgx (default_query_exec_mode=exec). The test
// bodies are the ordinary ones, their connections routed through the pooler.
func TestPgBouncerTransactionPooling(t *testing.T) {
	b := startPgBouncer(t)
	routeTests(t, map[string]string{
		"pq":  b.DSN(pgbouncerPQParams),
		"pgx": b.DSN("default_query_exec_mode=" + pgbouncerPGXMode),
	})
	// After the subtests (cleanups run last in, first out): the traffic did
	// go through the pooler.
	// PgBouncer's counters are refreshed every stats_period (1s here).
	t.Cleanup(func() {
		var n int64
		waitUntil(t, time.Minute, "PgBouncer to count the tests' transactions", func() bool {
			var err error
			if n, err = b.Transactions(context.Background()); err != nil {
				t.Fatalf("pgbouncer SHOW STATS: %v", err)
			}
			return n >= 500
		})
		t.Logf("PgBouncer passed %d transactions", n)
	})
	for _, tc := range []struct {
		name string
		test func(*testing.T)
	}{
		{"ConcurrentDuplicates", TestVerificationConcurrentDuplicatesApplyOnce},
		{"RedeliveryAppliesOnce", TestVerificationRedeliveryAppliesOnce},
		{"HandlerErrorRollsBack", TestHandlerErrorRollsBackClaimAndEffect},
		{"WaitingDuplicate", TestWaitingDuplicate},
		{"DeadHolderIsTakenOver", TestDeadHolderIsTakenOver},
		{"SerializableStorm", TestSerializableStorm},
		{"LockTimeout", TestLockTimeoutClaimBusy},
		{"StrictGuardCatchesExplicitCommit", TestStrictGuardCatchesExplicitCommit},
		{"StrictGuardOrdinaryUse", TestStrictGuardOrdinaryUse},
		{"GuardCatchesStatementsOutsideTheTransaction", TestGuardCatchesStatementsOutsideTheTransaction},
		{"CleanupAdvisoryLock", TestCleanupSecondRunnerReturnsAtOnce},
		{"MaintainPartitions", TestMaintainPartitionsCreatesAheadAndDropsOldDays},
		{"MaintainPartitionsConcurrently", TestMaintainPartitionsConcurrently},
	} {
		t.Run(tc.name, tc.test)
	}
}

// TestPgBouncerRelayFallsBackToPolling points a relay's LISTEN connection at
// PgBouncer in transaction mode, where the subscription lands on a server
// connection the pooler hands to other clients. The relay's test
// notification does not come back: it reports EventListenUnavailable,
// never EventListening, and goes on delivering by polling. The same relay
// with its LISTEN connection straight to the server passes the check.
func TestPgBouncerRelayFallsBackToPolling(t *testing.T) {
	b := startPgBouncer(t)
	db, err := sql.Open("postgres", b.DSN(pgbouncerPQParams))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeChecked(t, db) })
	db.SetMaxOpenConns(4)

	for _, tc := range []struct {
		name      string
		listenDSN string
		listens   bool
	}{
		{"through PgBouncer", b.DSN(""), false},
		{"straight to the server", pgDSN, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := newEventLog()
			ob, _ := newOutbox(t, db, "pooled", outbox.WithObserver(log))
			got := make(chan string, 4)
			r, err := outbox.NewRelay(ob, outbox.WithSender("ping", outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
				got <- m.IdempotencyKey
				return nil
			})), outbox.WithListener(tc.listenDSN), outbox.WithListenerCheck(time.Second), outbox.WithPollInterval(100*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			runRelay(t, r)
			waitUntil(t, time.Minute, "the relay's LISTEN check", func() bool {
				return log.Count(outbox.EventListening)+log.Count(outbox.EventListenUnavailable) > 0
			})
			if tc.listens {
				if n := log.Count(outbox.EventListenUnavailable); n != 0 {
					t.Fatalf("a LISTEN connection straight to the server failed its check: %v", log.of(outbox.EventListenUnavailable))
				}
			} else {
				evs := log.of(outbox.EventListenUnavailable)
				if len(evs) != 1 || !errors.Is(evs[0].Err, outbox.ErrListenUnavailable) || log.Count(outbox.EventListening) != 0 {
					t.Fatalf("LISTEN through PgBouncer: %d listening, unavailable %v; want one EventListenUnavailable wrapping ErrListenUnavailable", log.Count(outbox.EventListening), evs)
				}
				t.Logf("relay event: %v", evs[0].Err)
			}
			// Either way the row is delivered.
			key := enqueue(t, db, ob, "p-1", "ping", `{}`)
			select {
			case k := <-got:
				if k != key {
					t.Fatalf("relay sent %s, want %s", k, key)
				}
			case <-time.After(time.Minute):
				t.Fatal("row not sent a minute after commit")
			}
		})
	}
}
