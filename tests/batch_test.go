package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	"github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/postgres"
)

// batchDrivers are the database/sql drivers the batch tests run with.
var batchDrivers = []string{"postgres", "pgx"}

// openBatchDB is openDB for a named driver, with a capped pool.
func openBatchDB(t testing.TB, driverName string, maxConns int) *sql.DB {
	t.Helper()
	if pgDSN == "" {
		t.Skip(skipReason)
	}
	db, err := sql.Open(driverName, pgDSN)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	t.Cleanup(func() { closeChecked(t, db) })
	return db
}

// creditBatch is the loyalty effect written set-wise, as a batch consumer
// writes it: one UPDATE for all balances (customers in ascending order) and
// one INSERT for all ledger rows.
func (l *loyalty) creditBatch(ctx context.Context, tx *sql.Tx, msgs []orderCompleted) error {
	sum := map[int64]int64{}
	orders := make([]int64, len(msgs))
	customers := make([]int64, len(msgs))
	points := make([]int64, len(msgs))
	for i, o := range msgs {
		sum[o.CustomerID] += pointsFor(o)
		orders[i], customers[i], points[i] = o.OrderID, o.CustomerID, pointsFor(o)
	}
	ids := make([]int64, 0, len(sum))
	for c := range sum {
		ids = append(ids, c)
	}
	slices.Sort(ids)
	adds := make([]int64, len(ids))
	for i, c := range ids {
		adds[i] = sum[c]
	}
	q := pq.QuoteIdentifier(l.schema)
	if _, err := tx.ExecContext(ctx, "UPDATE "+q+".balances b SET points = b.points + u.p "+
		"FROM unnest($1::bigint[], $2::bigint[]) AS u(c, p) WHERE b.customer_id = u.c",
		pq.Array(ids), pq.Array(adds)); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, "INSERT INTO "+q+".point_ledger (customer_id, order_id, points) "+
		"SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[])",
		pq.Array(customers), pq.Array(orders), pq.Array(points))
	return err
}

func orderMsg(o orderCompleted) (idempotent.Message, error) {
	return idempotent.Message{Key: o.key()}, nil
}

// claimCount returns how many claims the loyalty consumer holds.
func (l *loyalty) claimCount(t testing.TB) int {
	t.Helper()
	var n int
	if err := l.db.QueryRow("SELECT count(*) FROM " + pq.QuoteIdentifier(l.schema) + ".processed_messages").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// ledgerTotals returns the number of ledger rows and the number of distinct
// orders in them.
func (l *loyalty) ledgerTotals(t testing.TB) (rows, orders int) {
	t.Helper()
	if err := l.db.QueryRow("SELECT count(*), count(DISTINCT order_id) FROM "+pq.QuoteIdentifier(l.schema)+".point_ledger").Scan(&rows, &orders); err != nil {
		t.Fatal(err)
	}
	return rows, orders
}

// checkBalances fails unless every balance equals the points of the given
// orders, each counted once.
func (l *loyalty) checkBalances(t testing.TB, orders []orderCompleted) {
	t.Helper()
	want := map[int64]int64{}
	seen := map[int64]bool{}
	for _, o := range orders {
		if !seen[o.OrderID] {
			seen[o.OrderID] = true
			want[o.CustomerID] += pointsFor(o)
		}
	}
	rows, err := l.db.Query("SELECT customer_id, points FROM " + pq.QuoteIdentifier(l.schema) + ".balances")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var c, p int64
		if err := rows.Scan(&c, &p); err != nil {
			t.Fatal(err)
		}
		if p != want[c] {
			t.Errorf("customer %d has %d points, want %d", c, p, want[c])
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}

func order(id int64) orderCompleted {
	return orderCompleted{OrderID: id, CustomerID: id%100 + 1, TotalCents: 100 * (id%7 + 1)}
}

func TestBatchAppliedThenDuplicate(t *testing.T) {
	t.Parallel()
	for _, drv := range batchDrivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			l := newLoyalty(t, openBatchDB(t, drv, 4))
			var got [][]int64
			process := idempotent.WrapMessages(l.mw, orderMsg, func(ctx context.Context, tx *sql.Tx, msgs []orderCompleted) error {
				var ids []int64
				for _, o := range msgs {
					ids = append(ids, o.OrderID)
				}
				got = append(got, ids)
				return l.creditBatch(ctx, tx, msgs)
			})
			ctx := context.Background()
			first := []orderCompleted{order(5), order(1), order(3)}
			outs, err := process(ctx, first)
			if err != nil {
				t.Fatal(err)
			}
			A, D := idempotent.Applied, idempotent.Duplicate
			if want := []idempotent.Outcome{A, A, A}; !slices.Equal(outs, want) {
				t.Fatalf("first batch: outcomes %v, want %v", outs, want)
			}
			second := []orderCompleted{order(2), order(3), order(4), order(5)}
			if outs, err = process(ctx, second); err != nil {
				t.Fatal(err)
			}
			if want := []idempotent.Outcome{A, D, A, D}; !slices.Equal(outs, want) {
				t.Fatalf("second batch: outcomes %v, want %v", outs, want)
			}
			if outs, err = process(ctx, first); err != nil {
				t.Fatal(err)
			}
			if want := []idempotent.Outcome{D, D, D}; !slices.Equal(outs, want) {
				t.Fatalf("redelivered batch: outcomes %v, want %v", outs, want)
			}
			if want := [][]int64{{5, 1, 3}, {2, 4}}; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("handler saw %v, want %v (only new messages, in batch order, no call for an all-duplicate batch)", got, want)
			}
			if rows, orders := l.ledgerTotals(t); rows != 5 || orders != 5 {
				t.Fatalf("%d ledger rows for %d orders, want 5 for 5", rows, orders)
			}
			if n := l.claimCount(t); n != 5 {
				t.Fatalf("%d claims, want 5", n)
			}
			l.checkBalances(t, append(first, second...))
		})
	}
}

func TestBatchInBatchDuplicates(t *testing.T) {
	t.Parallel()
	// noBatch hides the Postgres dialect's BatchClaimer, so the fallback
	// of one claim statement per key is tested too.
	type noBatch struct{ dialect.Dialect }
	for _, tc := range []struct {
		name string
		d    dialect.Dialect
	}{{"one statement", postgres.New()}, {"statement per key", noBatch{postgres.New()}}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l := newLoyalty(t, openDB(t))
			mw, err := idempotent.New(l.db, tc.d, "loyalty", idempotent.WithTable(l.schema+".processed_messages"))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if _, err := l.mw.ProcessMessage(ctx, idempotent.Message{Key: "k-d"}, func(context.Context, *sql.Tx) error { return nil }); err != nil {
				t.Fatal(err)
			}
			keys := []string{"k-b", "k-a", "k-b", "k-d", "k-c", "k-a", "k-b"}
			var fresh []int
			outs, err := mw.ProcessMessages(ctx, keyMessages(keys...), func(ctx context.Context, tx *sql.Tx, f []int) error {
				fresh = f
				for _, i := range f {
					if _, err := tx.ExecContext(ctx, "INSERT INTO "+pq.QuoteIdentifier(l.schema)+".point_ledger (customer_id, order_id, points) VALUES (1, $1, 1)", i); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			A, D := idempotent.Applied, idempotent.Duplicate
			if want := []idempotent.Outcome{A, A, D, D, A, D, D}; !slices.Equal(outs, want) {
				t.Fatalf("outcomes %v, want %v", outs, want)
			}
			if want := []int{0, 1, 4}; !slices.Equal(fresh, want) {
				t.Fatalf("handler got indexes %v, want %v", fresh, want)
			}
			if rows, orders := l.ledgerTotals(t); rows != 3 || orders != 3 {
				t.Fatalf("%d ledger rows for %d orders, want 3 for 3", rows, orders)
			}
			if n := l.claimCount(t); n != 4 {
				t.Fatalf("%d claims, want 4", n)
			}
		})
	}
}

func TestBatchHandlerErrorRollsBackWholeBatch(t *testing.T) {
	t.Parallel()
	l := newLoyalty(t, openDB(t))
	ctx := context.Background()
	boom := errors.New("boom")
	msgs := []orderCompleted{order(1), order(2), order(3)}
	fail := idempotent.WrapMessages(l.mw, orderMsg, func(ctx context.Context, tx *sql.Tx, msgs []orderCompleted) error {
		if err := l.creditBatch(ctx, tx, msgs); err != nil {
			return err
		}
		return boom
	})
	if outs, err := fail(ctx, msgs); !errors.Is(err, boom) || outs != nil {
		t.Fatalf("got (%v, %v), want (nil, error matching boom)", outs, err)
	}
	if n := l.claimCount(t); n != 0 {
		t.Fatalf("%d claims after a failed batch, want 0", n)
	}
	if rows, _ := l.ledgerTotals(t); rows != 0 {
		t.Fatalf("%d ledger rows after a failed batch, want 0", rows)
	}
	ok := idempotent.WrapMessages(l.mw, orderMsg, l.creditBatch)
	outs, err := ok(ctx, msgs)
	if err != nil || !slices.Equal(outs, []idempotent.Outcome{idempotent.Applied, idempotent.Applied, idempotent.Applied}) {
		t.Fatalf("redelivery: got (%v, %v), want all applied", outs, err)
	}
	l.checkBalances(t, msgs)
}

// overlappingBatches runs workers that each process rounds of batches drawn
// from one pool of orders, so batches overlap, with each batch's messages in
// random order. It returns how many times each order was reported Applied.
func overlappingBatches(t *testing.T, process func(context.Context, []orderCompleted) ([]idempotent.Outcome, error), pool []orderCompleted, workers, rounds, size int) map[int64]int {
	t.Helper()
	var mu sync.Mutex
	applied := map[int64]int{}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	start := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			<-start
			for range rounds {
				batch := make([]orderCompleted, size)
				for i := range batch {
					batch[i] = pool[rng.IntN(len(pool))]
				}
				outs, err := process(context.Background(), batch)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for i, o := range outs {
					if o == idempotent.Applied {
						applied[batch[i].OrderID]++
					}
				}
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	return applied
}

func TestBatchOverlappingBatchesDoNotDeadlock(t *testing.T) {
	t.Parallel()
	db := openBatchDB(t, "postgres", 9)
	// No retries: a deadlock between the claims of two batches would
	// surface as an error instead of being retried away. The handler writes
	// only ledger rows, so the claims are the only locks batches share.
	l := newLoyalty(t, db, idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 1}))
	// A trigger that slows each claim row down keeps batches inside their
	// claim statements long enough to cross each other.
	q := pq.QuoteIdentifier(l.schema)
	if _, err := db.Exec(`CREATE FUNCTION ` + q + `.slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.0005); RETURN NEW; END $$;
CREATE TRIGGER slow_claim BEFORE INSERT ON ` + q + `.processed_messages FOR EACH ROW EXECUTE FUNCTION ` + q + `.slow_claim()`); err != nil {
		t.Fatal(err)
	}
	ledgerOnly := func(ctx context.Context, tx *sql.Tx, msgs []orderCompleted) error {
		orders := make([]int64, len(msgs))
		for i, o := range msgs {
			orders[i] = o.OrderID
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO "+pq.QuoteIdentifier(l.schema)+".point_ledger (customer_id, order_id, points) "+
			"SELECT 1, o, 1 FROM unnest($1::bigint[]) o", pq.Array(orders))
		return err
	}
	pool := make([]orderCompleted, 300)
	for i := range pool {
		pool[i] = order(int64(i + 1))
	}
	applied := overlappingBatches(t, idempotent.WrapMessages(l.mw, orderMsg, ledgerOnly), pool, 8, 15, 40)
	rows, orders := l.ledgerTotals(t)
	if rows != orders || rows != len(applied) || rows != l.claimCount(t) {
		t.Fatalf("%d ledger rows, %d distinct orders, %d orders reported applied, %d claims: want all equal", rows, orders, len(applied), l.claimCount(t))
	}
	for id, n := range applied {
		if n != 1 {
			t.Errorf("order %d reported applied %d times", id, n)
		}
	}
}

func TestBatchSerializationStorm(t *testing.T) {
	t.Parallel()
	db := openBatchDB(t, "pgx", 9)
	counts := &idempotent.Counts{}
	l := newLoyalty(t, db,
		idempotent.WithTxOptions(sql.TxOptions{Isolation: sql.LevelSerializable}),
		idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 200, InitialBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond}),
		idempotent.WithObserver(counts))
	// Few customers and overlapping batches: under SERIALIZABLE, concurrent
	// batches fail with 40001 (and deadlock with 40P01) again and again.
	pool := make([]orderCompleted, 120)
	for i := range pool {
		pool[i] = orderCompleted{OrderID: int64(i + 1), CustomerID: int64(i%5 + 1), TotalCents: 100}
	}
	applied := overlappingBatches(t, idempotent.WrapMessages(l.mw, orderMsg, l.creditBatch), pool, 8, 10, 12)
	if counts.Retries() == 0 {
		t.Fatal("no batch was retried: the test did not provoke serialization failures")
	}
	t.Logf("%d retries, %d messages applied, %d duplicates", counts.Retries(), counts.Applied(), counts.Duplicates())
	var seen []orderCompleted
	for _, o := range pool {
		switch applied[o.OrderID] {
		case 0:
		case 1:
			seen = append(seen, o)
		default:
			t.Errorf("order %d reported applied %d times", o.OrderID, applied[o.OrderID])
		}
	}
	rows, orders := l.ledgerTotals(t)
	if rows != len(seen) || orders != len(seen) || l.claimCount(t) != len(seen) {
		t.Fatalf("%d ledger rows for %d orders and %d claims, want %d of each", rows, orders, l.claimCount(t), len(seen))
	}
	l.checkBalances(t, seen)
	if failed := counts.Failed(); failed != 0 {
		t.Fatalf("%d messages failed", failed)
	}
}

func TestBatchBadInput(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	schema := tempSchema(t, db)
	// The claim table does not exist: anything sent to the database would
	// fail with ErrNoClaimTable, so the errors below prove nothing was sent.
	mw, err := idempotent.New(db, postgres.New(), "loyalty", idempotent.WithTable(schema+".processed_messages"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	called := false
	fn := func(context.Context, *sql.Tx, []int) error { called = true; return nil }
	many := make([]string, idempotent.MaxBatchSize+1)
	for i := range many {
		many[i] = fmt.Sprintf("k%d", i)
	}
	for _, tc := range []struct {
		name  string
		keys  []string
		fn    idempotent.BatchFunc
		want  error
		index int // for ErrInvalidKey
	}{
		{name: "empty key", keys: []string{"a", "b", "c", ""}, fn: fn, want: idempotent.ErrInvalidKey, index: 3},
		{name: "NUL byte", keys: []string{"a", "b\x00"}, fn: fn, want: idempotent.ErrInvalidKey, index: 1},
		{name: "bad UTF-8", keys: []string{"\xff", "b"}, fn: fn, want: idempotent.ErrInvalidKey, index: 0},
		{name: "too long", keys: []string{"a", "b", strings.Repeat("x", postgres.MaxKeyBytes+1)}, fn: fn, want: idempotent.ErrInvalidKey, index: 2},
		{name: "over the maximum", keys: many, fn: fn, want: idempotent.ErrBatchTooLarge},
		{name: "nil function", keys: []string{"a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outs, err := mw.ProcessMessages(ctx, keyMessages(tc.keys...), tc.fn)
			if err == nil || outs != nil {
				t.Fatalf("got (%v, %v), want an error", outs, err)
			}
			if errors.Is(err, idempotent.ErrNoClaimTable) {
				t.Fatalf("the batch reached the database: %v", err)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("error %v does not match %v", err, tc.want)
			}
			if tc.want == idempotent.ErrInvalidKey {
				var ke *idempotent.BatchKeyError
				if !errors.As(err, &ke) || ke.Index != tc.index {
					t.Fatalf("error %v: want a *BatchKeyError with Index %d", err, tc.index)
				}
			}
		})
	}
	if outs, err := mw.ProcessMessages(ctx, keyMessages(nil...), fn); outs != nil || err != nil {
		t.Fatalf("empty batch: got (%v, %v), want (nil, nil)", outs, err)
	}
	if called {
		t.Fatal("the handler ran")
	}
	// The same batch against an existing table reaches it: the checks above
	// are what kept the others out.
	if _, err := mw.ProcessMessages(ctx, keyMessages("a"), fn); !errors.Is(err, idempotent.ErrNoClaimTable) {
		t.Fatalf("valid batch without a claim table: %v, want ErrNoClaimTable", err)
	}

	wrapped := idempotent.WrapMessages(mw, func(o orderCompleted) (idempotent.Message, error) {
		if o.OrderID < 0 {
			return idempotent.Message{}, errors.New("negative order id")
		}
		return idempotent.Message{Key: o.key()}, nil
	}, func(context.Context, *sql.Tx, []orderCompleted) error { called = true; return nil })
	_, err = wrapped(ctx, []orderCompleted{order(1), order(2), {OrderID: -1}})
	var ke *idempotent.BatchKeyError
	if !errors.Is(err, idempotent.ErrInvalidKey) || !errors.As(err, &ke) || ke.Index != 2 {
		t.Fatalf("key function failure: %v, want ErrInvalidKey for index 2", err)
	}
	if _, err := wrapped(ctx, make([]orderCompleted, idempotent.MaxBatchSize+1)); !errors.Is(err, idempotent.ErrBatchTooLarge) {
		t.Fatalf("oversized wrapped batch: %v, want ErrBatchTooLarge", err)
	}
	if outs, err := wrapped(ctx, nil); outs != nil || err != nil {
		t.Fatalf("empty wrapped batch: got (%v, %v), want (nil, nil)", outs, err)
	}
	if called {
		t.Fatal("the handler ran")
	}
}

func TestBatchAwkwardKeys(t *testing.T) {
	t.Parallel()
	// Keys that an array literal must quote: each must be claimed as it is
	// and found again among the keys the claim statement returns.
	keys := []string{"NULL", "null", "a,b", "{x}", `"q"`, `back\slash`, "ünïcode ✓", " lead", "trail ", "tab\tnew\nline", strings.Repeat("k", postgres.MaxKeyBytes)}
	for _, drv := range batchDrivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			l := newLoyalty(t, openBatchDB(t, drv, 2))
			ctx := context.Background()
			for _, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
				outs, err := l.mw.ProcessMessages(ctx, keyMessages(keys...), func(context.Context, *sql.Tx, []int) error { return nil })
				if err != nil {
					t.Fatal(err)
				}
				for i, o := range outs {
					if o != want {
						t.Errorf("key %q: %v, want %v", keys[i], o, want)
					}
				}
			}
			rows, err := l.db.Query("SELECT message_key FROM " + pq.QuoteIdentifier(l.schema) + ".processed_messages ORDER BY message_key COLLATE \"C\"")
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var stored []string
			for rows.Next() {
				var k string
				if err := rows.Scan(&k); err != nil {
					t.Fatal(err)
				}
				stored = append(stored, k)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			want := slices.Clone(keys)
			slices.Sort(want)
			if !slices.Equal(stored, want) {
				t.Fatalf("stored keys %q, want %q", stored, want)
			}
		})
	}
}
