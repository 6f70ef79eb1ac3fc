package tests

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/mysql"
)

// TestGaleraClaimsOnTwoNodesAtOnce starts a three-node MariaDB Galera
// cluster (tests/internal/galera), creates the claim table through the
// mysql dialect's EnsureSchema on one node (DDL replicated under TOI) and
// finds it on the others, then delivers each of N keys twice at the same
// instant on two different nodes: both claims insert locally, Galera's
// certification lets one commit and aborts the other (1213 at COMMIT),
// which is retried and finds the claim. Every key must end with exactly
// one Applied and one Duplicate, and one effect. N is 1,000, or
// IDEMPOTENT_GALERA_PAIRS. It runs only with IDEMPOTENT_GALERA=1: starting
// the cluster alone takes minutes on a loaded machine.
func TestGaleraClaimsOnTwoNodesAtOnce(t *testing.T) {
	galeraOrSkip(t)
	heavy(t)
	pairs := 1000
	if v := os.Getenv("IDEMPOTENT_GALERA_PAIRS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("IDEMPOTENT_GALERA_PAIRS=%q: want a positive count", v)
		}
		pairs = n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := startGalera(t, ctx)

	admin, err := sql.Open("mysql", c.Nodes[0].DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE app"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ExecContext(ctx, "CREATE TABLE app.effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(64) NOT NULL, node INT NOT NULL) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	obs := &retryCodes{}
	mws := make([]*idempotent.Middleware, len(c.Nodes))
	for i, n := range c.Nodes {
		db, err := sql.Open("mysql", n.DSN("app"))
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(4)
		t.Cleanup(func() { _ = db.Close() })
		mws[i], err = idempotent.New(db, mysql.New(), "billing", idempotent.WithObserver(obs),
			idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 50, InitialBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond}))
		if err != nil {
			t.Fatal(err)
		}
		// Node 1 creates the table; nodes 2 and 3 find it replicated.
		if err := mws[i].EnsureSchema(ctx); err != nil {
			t.Fatalf("EnsureSchema on %s: %v", n.Name, err)
		}
	}

	var applied, duplicate atomic.Int64
	for i := range pairs {
		key := fmt.Sprintf("order-%d", i)
		a, b := i%3, (i+1)%3
		var ready, done sync.WaitGroup
		start := make(chan struct{})
		outs := make([]idempotent.Outcome, 2)
		errs := make([]error, 2)
		for j, node := range []int{a, b} {
			ready.Add(1)
			done.Add(1)
			go func() {
				defer done.Done()
				ready.Done()
				<-start
				outs[j], errs[j] = mws[node].ProcessMessage(ctx, idempotent.Message{Key: key}, func(ctx context.Context, tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, "INSERT INTO effects (k, node) VALUES (?, ?)", key, node+1)
					return err
				})
			}()
		}
		ready.Wait()
		close(start)
		done.Wait()
		for j := range 2 {
			if errs[j] != nil {
				t.Fatalf("%s on node %d: %v", key, []int{a, b}[j]+1, errs[j])
			}
			if outs[j] == idempotent.Applied {
				applied.Add(1)
			} else {
				duplicate.Add(1)
			}
		}
		if outs[0] == outs[1] {
			t.Fatalf("%s: both deliveries %v", key, outs[0])
		}
	}

	// Read on the third node, after it applied everything before the read
	// (wsrep_sync_wait).
	conn, err := sql.Open("mysql", c.Nodes[2].DSN("app"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetMaxOpenConns(1)
	if _, err := conn.ExecContext(ctx, "SET SESSION wsrep_sync_wait = 1"); err != nil {
		t.Fatal(err)
	}
	var rows, keys, claims int
	if err := conn.QueryRowContext(ctx, "SELECT count(*), count(DISTINCT k) FROM effects").Scan(&rows, &keys); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRowContext(ctx, "SELECT count(*) FROM processed_messages WHERE consumer = 'billing'").Scan(&claims); err != nil {
		t.Fatal(err)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	t.Logf("%d keys delivered twice at once on two nodes: %d applied, %d duplicate; %d effects of %d keys, %d claims; retries by code %v",
		pairs, applied.Load(), duplicate.Load(), rows, keys, claims, obs.codes)
	if rows != pairs || keys != pairs || claims != pairs || applied.Load() != int64(pairs) {
		t.Fatalf("%d effects of %d keys and %d claims for %d keys, %d applied: want one of each per key", rows, keys, claims, pairs, applied.Load())
	}
}
