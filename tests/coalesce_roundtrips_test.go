package tests

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/postgres"
)

// tripCounter is a TCP proxy in front of the test database that counts
// round trips: each time the client sends after the server has answered,
// it waited for that answer. Bytes the client sends before any answer —
// a pipeline — count once.
type tripCounter struct {
	ln    net.Listener
	trips atomic.Int64
	wg    sync.WaitGroup
}

func startTripCounter(t *testing.T, target string) *tripCounter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tripCounter{ln: ln}
	t.Cleanup(func() { _ = ln.Close(); p.wg.Wait() })
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			var answered atomic.Bool
			answered.Store(true)
			pump := func(dst, src net.Conn, fromClient bool) {
				defer p.wg.Done()
				defer func() { _ = dst.Close() }()
				buf := make([]byte, 64<<10)
				for {
					n, err := src.Read(buf)
					if n > 0 {
						if !fromClient {
							answered.Store(true)
						} else if answered.Swap(false) {
							p.trips.Add(1)
						}
						if _, err := dst.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}
			p.wg.Add(2)
			go pump(s, c, true)
			go pump(c, s, false)
		}
	}()
	return p
}

// TestCoalescedGroupRoundTrips counts the round trips of a coalesced group
// of n messages, each handler running two statements with parameters, on
// one connection, against the formulas docs/performance.md gives: with p
// round trips per statement with parameters (lib/pq sends Parse/Describe,
// then Bind/Execute: 2; pgx's stdlib, its statements prepared once per
// connection: 1) and 1 for a statement without,
//
//   - one message alone:        BEGIN, claim, 2 statements, COMMIT      = 2 + 3p
//   - optimistic group of n:    BEGIN, claim, fence, n handlers, n-1 fenced claims, check, COMMIT = 2 + 2p + 3pn
//   - savepoints, group of n:   BEGIN, the lock wait bound with the first SAVEPOINT, n claims and
//     handlers, each RELEASE but the last with the next SAVEPOINT, the last RELEASE, COMMIT = 3 + (3p + 1)n
//
// The savepoints' count is the one the joined RELEASE and SAVEPOINT
// (dialect.StatementJoiner) bring down from 3 + (3p + 2)n.
func TestCoalescedGroupRoundTrips(t *testing.T) {
	const n = 4
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			if pgDSN == "" {
				t.Skip(skipReason)
			}
			p := map[string]int{"pq": 2, "pgx": 1}[drv]
			admin := openDB(t)
			schema := tempSchema(t, admin)
			claims, audit := schema+".claims", schema+".audit"
			if _, err := admin.Exec("CREATE TABLE " + audit + " (k text NOT NULL, v int NOT NULL)"); err != nil {
				t.Fatal(err)
			}
			proxy := startTripCounter(t, dsnHost(t, pgDSN))
			db := openGuardedDSN(t, drv, dsnWithHost(t, pgDSN, proxy.ln.Addr().String()), 1)
			db.SetMaxIdleConns(1)
			ctx := context.Background()
			handler := func(key string) idempotent.TxFunc {
				return func(ctx context.Context, tx *sql.Tx) error {
					if _, err := tx.ExecContext(ctx, "UPDATE "+audit+" SET v = v + $1 WHERE k = $2", 1, key); err != nil {
						return err
					}
					_, err := tx.ExecContext(ctx, "INSERT INTO "+audit+" (k, v) VALUES ($1, $2)", key, 1)
					return err
				}
			}
			table := idempotent.WithTable(claims)
			single, err := idempotent.New(db, postgres.New(), "rt", table)
			if err != nil {
				t.Fatal(err)
			}
			if err := single.EnsureSchema(ctx); err != nil {
				t.Fatal(err)
			}
			run := func(mw *idempotent.Middleware, prefix string, calls int) int64 {
				t.Helper()
				before := proxy.trips.Load()
				var wg sync.WaitGroup
				errs := make(chan error, calls)
				for i := range calls {
					wg.Add(1)
					go func() {
						defer wg.Done()
						key := fmt.Sprintf("%s-%d", prefix, i)
						out, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, handler(key))
						if err == nil && out != idempotent.Applied {
							err = fmt.Errorf("%s: outcome %v, want applied", key, out)
						}
						errs <- err
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					if err != nil {
						t.Fatal(err)
					}
				}
				return proxy.trips.Load() - before
			}
			run(single, "warm", 1) // connects, and pgx prepares the statements
			if got, want := run(single, "one", 1), int64(2+3*p); got != want {
				t.Errorf("one message alone: %d round trips, want %d", got, want)
			}
			for _, sp := range []bool{false, true} {
				mw, err := idempotent.New(db, postgres.New(), "rt", table,
					idempotent.WithCoalescing(idempotent.Coalescing{Max: n, Wait: time.Second, Savepoints: sp}))
				if err != nil {
					t.Fatal(err)
				}
				run(mw, fmt.Sprintf("warm-%v", sp), n) // pgx prepares the group's statements
				want := int64(2 + 2*p + 3*p*n)
				if sp {
					want = int64(3 + (3*p+1)*n)
				}
				if got := run(mw, fmt.Sprintf("group-%v", sp), n); got != want {
					t.Errorf("a group of %d, savepoints %v: %d round trips, want %d", n, sp, got, want)
				}
			}
		})
	}
}
