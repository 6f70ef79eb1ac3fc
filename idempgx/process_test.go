package idempgx_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idempgx"
)

func insertEffect(s, id string) idempgx.Func {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+s+".effects (id) VALUES ($1)", id)
		return err
	}
}

func TestProcessAppliesOnceAndDuplicates(t *testing.T) {
	t.Parallel()
	p, s, m := setup(t, 4)
	ctx := context.Background()
	for i, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
		got, err := m.ProcessMessage(ctx, idempotent.Message{Key: "k1"}, insertEffect(s, "e1"))
		if err != nil || got != want {
			t.Fatalf("delivery %d: %v, %v; want %v", i, got, err, want)
		}
	}
	if n := count(t, p, "SELECT count(*) FROM "+s+".effects"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if n := count(t, p, "SELECT count(*) FROM "+s+".claims WHERE consumer = 'orders' AND message_key = 'k1'"); n != 1 {
		t.Fatalf("%d claims, want 1", n)
	}
}

// TestConcurrentDuplicates: N deliveries of one key at once, 1 applied and
// N-1 duplicates, one effect.
func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	const n = 8
	p, s, m := setup(t, n)
	var applied, dups atomic.Int32
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			o, err := m.ProcessMessage(context.Background(), idempotent.Message{Key: "same"}, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO "+s+".effects (id, n) VALUES ('x', 1) ON CONFLICT (id) DO UPDATE SET n = effects.n + 1")
				return err
			})
			switch {
			case err != nil:
				t.Error(err)
			case o == idempotent.Applied:
				applied.Add(1)
			case o == idempotent.Duplicate:
				dups.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	if applied.Load() != 1 || dups.Load() != n-1 {
		t.Fatalf("applied %d, duplicates %d; want 1 and %d", applied.Load(), dups.Load(), n-1)
	}
	if got := count(t, p, "SELECT n FROM "+s+".effects WHERE id = 'x'"); got != 1 {
		t.Fatalf("effect applied %d times", got)
	}
}

// TestRollbackTakeOver: a delivery whose handler fails while a duplicate
// waits on its claim; the waiting one applies.
func TestRollbackTakeOver(t *testing.T) {
	t.Parallel()
	p, s, m := setup(t, 4)
	holding := make(chan struct{})
	release := make(chan struct{})
	errBoom := errors.New("boom")
	firstDone := make(chan error, 1)
	go func() {
		_, err := m.ProcessMessage(context.Background(), idempotent.Message{Key: "k"}, func(ctx context.Context, tx pgx.Tx) error {
			close(holding)
			<-release
			return errBoom
		})
		firstDone <- err
	}()
	<-holding
	secondDone := make(chan struct {
		o   idempotent.Outcome
		err error
	}, 1)
	go func() {
		o, err := m.ProcessMessage(context.Background(), idempotent.Message{Key: "k"}, insertEffect(s, "second"))
		secondDone <- struct {
			o   idempotent.Outcome
			err error
		}{o, err}
	}()
	// The second delivery waits on the first one's claim.
	waitFor(t, "the duplicate to wait on the claim", func() bool {
		return count(t, p, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO "+"\""+s+"\""+".%'") >= 1
	})
	close(release)
	if err := <-firstDone; !errors.Is(err, errBoom) {
		t.Fatalf("first: %v, want boom", err)
	}
	r := <-secondDone
	if r.err != nil || r.o != idempotent.Applied {
		t.Fatalf("second: %v, %v; want applied", r.o, r.err)
	}
	if n := count(t, p, "SELECT count(*) FROM "+s+".effects WHERE id = 'second'"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
}

// TestHandlerErrorNotRetried: a handler's own error, even a 40001 that came
// from a statement outside the claim's transaction, is returned at once.
func TestHandlerErrorNotRetried(t *testing.T) {
	t.Parallel()
	p, s, m := setup(t, 4)
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"plain", errors.New("insufficient funds")},
		{"foreign 40001", &pgconn.PgError{Code: "40001", Message: "from another connection"}},
		{"foreign conn lost", fmt.Errorf("other service: %w", &pgconn.PgError{Code: "08006"})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			_, err := m.ProcessMessage(context.Background(), idempotent.Message{Key: "err-" + tc.name}, func(ctx context.Context, tx pgx.Tx) error {
				calls++
				return tc.err
			})
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if calls != 1 {
				t.Fatalf("handler ran %d times, want 1", calls)
			}
		})
	}
	if n := count(t, p, "SELECT count(*) FROM "+s+".claims"); n != 0 {
		t.Fatalf("%d claims left by failed deliveries", n)
	}
}

// TestSerializableStorm: many deliveries of few keys under SERIALIZABLE,
// each handler reading and writing a shared counter: every key applied
// exactly once, the rest duplicates, with retries.
func TestSerializableStorm(t *testing.T) {
	t.Parallel()
	const workers, keys, rounds = 8, 20, 3
	var retries idempotent.Counts
	p, s, m := setup(t, workers, idempgx.WithIsolation(pgx.Serializable), idempgx.WithObserver(&retries),
		idempgx.WithRetry(idempotent.RetryPolicy{MaxAttempts: 100, InitialBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond}))
	exec(t, p, "INSERT INTO "+s+".effects (id, n) VALUES ('total', 0)")
	var applied atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	// The first handler of each worker waits, after its read, until every
	// worker has read: all but one of them must then fail to serialize.
	var read sync.WaitGroup
	read.Add(workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			first := true
			for r := 0; r < rounds; r++ {
				for i := 0; i < keys; i++ {
					k := (i + w*keys/workers) % keys
					o, err := m.ProcessMessage(context.Background(), idempotent.Message{Key: fmt.Sprintf("s%d", k)}, func(ctx context.Context, tx pgx.Tx) error {
						var n int
						if err := tx.QueryRow(ctx, "SELECT n FROM "+s+".effects WHERE id = 'total'").Scan(&n); err != nil {
							return err
						}
						if first {
							first = false
							read.Done()
							read.Wait()
						}
						_, err := tx.Exec(ctx, "UPDATE "+s+".effects SET n = $1 WHERE id = 'total'", n+1)
						return err
					})
					if err != nil {
						t.Error(err)
						return
					}
					if o == idempotent.Applied {
						applied.Add(1)
					}
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	if applied.Load() != keys {
		t.Fatalf("applied %d, want %d", applied.Load(), keys)
	}
	if n := count(t, p, "SELECT n FROM "+s+".effects WHERE id = 'total'"); n != keys {
		t.Fatalf("counter %d, want %d", n, keys)
	}
	if retries.Retries() < workers-1 {
		t.Fatalf("%d retries, want at least %d", retries.Retries(), workers-1)
	}
	if retries.Failed() != 0 {
		t.Fatalf("%d failed deliveries", retries.Failed())
	}
}

// TestBackendKilledMidHandler: the claim's backend is terminated while the
// handler runs; the delivery is retried once on a new connection and
// applied once.
func TestBackendKilledMidHandler(t *testing.T) {
	t.Parallel()
	p, s, m := setup(t, 4)
	var calls atomic.Int32
	var retryCodes []string
	var mu sync.Mutex
	obs := observerFunc(func(e idempotent.RetryEvent) {
		mu.Lock()
		retryCodes = append(retryCodes, e.Reason)
		mu.Unlock()
	})
	m2, err := idempgx.New(p, "orders", idempgx.WithTable(s+".claims"), idempgx.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	_ = m
	o, err := m2.ProcessMessage(context.Background(), idempotent.Message{Key: "killed"}, func(ctx context.Context, tx pgx.Tx) error {
		if calls.Add(1) == 1 {
			var pid int
			if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				return err
			}
			if _, err := p.Exec(context.Background(), "SELECT pg_terminate_backend($1)", pid); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+s+".effects (id) VALUES ('killed')")
		return err
	})
	if err != nil || o != idempotent.Applied {
		t.Fatalf("%v, %v; want applied", o, err)
	}
	if calls.Load() != 2 {
		t.Fatalf("handler ran %d times, want 2", calls.Load())
	}
	if len(retryCodes) != 1 || retryCodes[0] != "connection" {
		t.Fatalf("retries %v, want one connection retry", retryCodes)
	}
	if n := count(t, p, "SELECT count(*) FROM "+s+".effects"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
}

type observerFunc func(idempotent.RetryEvent)

func (observerFunc) Outcome(context.Context, idempotent.Event)          {}
func (f observerFunc) Retry(_ context.Context, e idempotent.RetryEvent) { f(e) }

func TestProcessMessagesWithoutEventTimes(t *testing.T) {
	t.Parallel()
	p, s, m := setup(t, 4)
	ctx := context.Background()
	if _, err := m.ProcessMessage(ctx, idempotent.Message{Key: "b"}, insertEffect(s, "b")); err != nil {
		t.Fatal(err)
	}
	var got []int
	outcomes, err := m.ProcessMessages(ctx, keyMessages("c", "b", "a", "c"), func(ctx context.Context, tx pgx.Tx, fresh []int) error {
		got = append([]int(nil), fresh...)
		for _, i := range fresh {
			if _, err := tx.Exec(ctx, "INSERT INTO "+s+".effects (id) VALUES ($1)", []string{"c", "b", "a", "c"}[i]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate, idempotent.Applied, idempotent.Duplicate}
	if fmt.Sprint(outcomes) != fmt.Sprint(want) || fmt.Sprint(got) != "[0 2]" {
		t.Fatalf("outcomes %v fresh %v; want %v [0 2]", outcomes, got, want)
	}
	if n := count(t, p, "SELECT count(*) FROM "+s+".effects"); n != 3 {
		t.Fatalf("%d effects, want 3", n)
	}
	// All duplicates: the function does not run.
	outcomes, err = m.ProcessMessages(ctx, keyMessages("a", "b"), func(context.Context, pgx.Tx, []int) error { return errors.New("ran") })
	if err != nil || fmt.Sprint(outcomes) != "[duplicate duplicate]" {
		t.Fatalf("%v, %v", outcomes, err)
	}
}

// TestContextEndsWhileClaimWaits: a duplicate waiting at its claim for the
// holder's transaction returns when its context ends — the claim's round
// trip is watched for the context — with an error matching
// context.DeadlineExceeded; its connection is discarded, and the holder and
// the pool carry on.
func TestContextEndsWhileClaimWaits(t *testing.T) {
	t.Parallel()
	p, s, m := setup(t, 2)
	holding, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := m.ProcessMessage(context.Background(), idempotent.Message{Key: "held"}, func(ctx context.Context, tx pgx.Tx) error {
			close(holding)
			<-release
			return insertEffect(s, "held")(ctx, tx)
		})
		done <- err
	}()
	select {
	case <-holding:
	case err := <-done:
		t.Fatalf("the first delivery ended before its handler ran: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	waited := make(chan error, 1)
	go func() {
		_, err := m.ProcessMessage(ctx, idempotent.Message{Key: "held"}, insertEffect(s, "second"))
		waited <- err
	}()
	select {
	case err := <-waited:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want context.DeadlineExceeded", err)
		}
	case <-time.After(20 * time.Second): // a bound on a hang, not synchronisation
		t.Error("the waiting claim did not return when its context ended")
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if o, err := m.ProcessMessage(context.Background(), idempotent.Message{Key: "after"}, insertEffect(s, "after")); err != nil || o != idempotent.Applied {
		t.Fatalf("the pool after the cut connection: %v, %v", o, err)
	}
	if n := count(t, p, "SELECT count(*) FROM "+s+".effects"); n != 2 {
		t.Fatalf("%d effects, want the holder's and the one after", n)
	}
}

func TestLockTimeoutClaimBusy(t *testing.T) {
	t.Parallel()
	_, s, m := setup(t, 4, idempgx.WithLockTimeout(50*time.Millisecond))
	holding, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := m.ProcessMessage(context.Background(), idempotent.Message{Key: "busy"}, func(ctx context.Context, tx pgx.Tx) error {
			close(holding)
			<-release
			return nil
		})
		done <- err
	}()
	select {
	case <-holding:
	case err := <-done:
		t.Fatalf("the first delivery ended before its handler ran: %v", err)
	}
	// Bounded, so that a claim that waits for ever fails the test instead
	// of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := m.ProcessMessage(ctx, idempotent.Message{Key: "busy"}, insertEffect(s, "second"))
	close(release)
	if !errors.Is(err, idempotent.ErrClaimBusy) {
		t.Fatalf("err = %v, want ErrClaimBusy", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestPartitionedEvent(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	p, s, m := setup(t, 4, idempgx.WithDailyPartitions(2), idempgx.WithRetention(7*24*time.Hour), idempgx.WithClock(func() time.Time { return now }))
	ctx := context.Background()
	for i, want := range []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate} {
		o, err := m.ProcessMessage(ctx, idempotent.Message{Key: "e1", EventTime: now.Add(-time.Hour)}, insertEffect(s, "e1"))
		if err != nil || o != want {
			t.Fatalf("delivery %d: %v, %v", i, o, err)
		}
	}
	if o, err := m.ProcessMessage(ctx, idempotent.Message{Key: "e1", EventTime: now.Add(-time.Hour)}, insertEffect(s, "e1")); err != nil || o != idempotent.Duplicate {
		t.Fatalf("ProcessMessage of the same message: %v, %v; want duplicate", o, err)
	}
	if _, err := m.ProcessMessage(ctx, idempotent.Message{Key: "e2"}, insertEffect(s, "e2")); !errors.Is(err, idempotent.ErrInvalidEventTime) {
		t.Fatalf("ProcessMessage without event time in partitioned mode: %v, want ErrInvalidEventTime", err)
	}
	// Later than the clock plus the skew margin: refused before anything
	// is sent, as the core does.
	if _, err := m.ProcessMessage(ctx, idempotent.Message{Key: "e3", EventTime: now.Add(10 * 24 * time.Hour)}, insertEffect(s, "e3")); !errors.Is(err, idempotent.ErrInvalidEventTime) || errors.Is(err, idempotent.ErrBeyondRetention) {
		t.Fatalf("future event: %v, want ErrInvalidEventTime", err)
	}
	if _, err := m.ProcessMessage(ctx, idempotent.Message{Key: "e4", EventTime: now.Add(-8 * 24 * time.Hour)}, insertEffect(s, "e4")); !errors.Is(err, idempotent.ErrBeyondRetention) {
		t.Fatalf("old event: %v, want ErrBeyondRetention", err)
	}
	// Inside the window, but its day's partition is gone: ErrNoPartition,
	// transient, never ErrBeyondRetention.
	exec(t, p, "DROP TABLE "+s+".claims_p20260305")
	if _, err := m.ProcessMessage(ctx, idempotent.Message{Key: "e5", EventTime: now.Add(-5 * 24 * time.Hour)}, insertEffect(s, "e5")); !errors.Is(err, idempotent.ErrNoPartition) || errors.Is(err, idempotent.ErrBeyondRetention) {
		t.Fatalf("a day without its partition: %v, want ErrNoPartition", err)
	}
	if n := count(t, p, "SELECT count(*) FROM "+s+".effects"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
}

// TestPartitionedBatch: ProcessMessages in partitioned mode claims a batch
// spanning days in one statement, each claim in its day's partition; a
// redelivery is a duplicate; bad event times and a missing partition refuse
// the whole batch and write nothing.
func TestPartitionedBatch(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	p, s, m := setup(t, 4, idempgx.WithDailyPartitions(2), idempgx.WithRetention(7*24*time.Hour), idempgx.WithClock(func() time.Time { return now }))
	ctx := context.Background()
	msgs := []idempotent.Message{
		{Key: "c", EventTime: now},
		{Key: "a", EventTime: now.Add(-48 * time.Hour)},
		{Key: "b", EventTime: now.Add(-24 * time.Hour)},
		{Key: "a", EventTime: now.Add(-47 * time.Hour)}, // the same day
	}
	insert := func(ctx context.Context, tx pgx.Tx, fresh []int) error {
		for _, i := range fresh {
			if err := insertEffect(s, msgs[i].Key)(ctx, tx); err != nil {
				return err
			}
		}
		return nil
	}
	outs, err := m.ProcessMessages(ctx, msgs, insert)
	if want := []idempotent.Outcome{idempotent.Applied, idempotent.Applied, idempotent.Applied, idempotent.Duplicate}; err != nil || !slices.Equal(outs, want) {
		t.Fatalf("first delivery: %v, %v; want %v", outs, err, want)
	}
	for key, part := range map[string]string{"a": "claims_p20260308", "b": "claims_p20260309", "c": "claims_p20260310"} {
		if n := count(t, p, "SELECT count(*) FROM "+s+"."+part+" WHERE message_key = '"+key+"'"); n != 1 {
			t.Fatalf("claim of %s: %d rows in %s, want 1", key, n, part)
		}
	}
	outs, err = m.ProcessMessages(ctx, msgs, insert)
	if err != nil || slices.Contains(outs, idempotent.Applied) {
		t.Fatalf("redelivery: %v, %v; want all duplicates", outs, err)
	}
	var bke *idempotent.BatchKeyError
	for name, c := range map[string]struct {
		msgs []idempotent.Message
		want error
		idx  int
	}{
		"no event time":       {[]idempotent.Message{{Key: "d", EventTime: now}, {Key: "e"}}, idempotent.ErrInvalidEventTime, 1},
		"in the future":       {[]idempotent.Message{{Key: "d", EventTime: now.Add(time.Hour)}}, idempotent.ErrInvalidEventTime, 0},
		"beyond retention":    {[]idempotent.Message{{Key: "d", EventTime: now}, {Key: "e", EventTime: now.Add(-8 * 24 * time.Hour)}}, idempotent.ErrBeyondRetention, 1},
		"one key on two days": {[]idempotent.Message{{Key: "d", EventTime: now}, {Key: "d", EventTime: now.Add(-24 * time.Hour)}}, idempotent.ErrInvalidEventTime, 1},
	} {
		_, err := m.ProcessMessages(ctx, c.msgs, func(context.Context, pgx.Tx, []int) error { t.Errorf("%s: the handler ran", name); return nil })
		if !errors.Is(err, c.want) || !errors.As(err, &bke) || bke.Index != c.idx {
			t.Fatalf("%s: %v, want %v at index %d", name, err, c.want, c.idx)
		}
	}
	if _, err := m.ProcessMessages(ctx, keyMessages("d"), func(context.Context, pgx.Tx, []int) error { return nil }); !errors.Is(err, idempotent.ErrInvalidEventTime) {
		t.Fatalf("ProcessMessages without event times in partitioned mode: %v, want ErrInvalidEventTime", err)
	}
	exec(t, p, "DROP TABLE "+s+".claims_p20260305")
	_, err = m.ProcessMessages(ctx, []idempotent.Message{{Key: "d", EventTime: now}, {Key: "e", EventTime: now.Add(-5 * 24 * time.Hour)}}, insert)
	if !errors.Is(err, idempotent.ErrNoPartition) || !strings.Contains(err.Error(), "one of the event days 2026-03-05, 2026-03-10") {
		t.Fatalf("a batch with a day without its partition: %v, want ErrNoPartition naming the days", err)
	}
	if n := count(t, p, "SELECT count(*) FROM "+s+".effects"); n != 3 {
		t.Fatalf("%d effects, want 3", n)
	}
	if n := count(t, p, "SELECT count(*) FROM "+s+".claims"); n != 3 {
		t.Fatalf("%d claims, want 3", n)
	}
}

// TestErrorsMatchAcrossPaths: a claim taken through the database/sql
// Middleware is a duplicate here, and the other way round.
func TestErrorsMatchAcrossPaths(t *testing.T) {
	t.Parallel()
	_, s, m := setup(t, 4)
	ctx := context.Background()
	if o, err := m.Core().ProcessMessage(ctx, idempotent.Message{Key: "shared"}, func(context.Context, *sql.Tx) error { return nil }); err != nil || o != idempotent.Applied {
		t.Fatalf("core: %v, %v", o, err)
	}
	if o, err := m.ProcessMessage(ctx, idempotent.Message{Key: "shared"}, insertEffect(s, "x")); err != nil || o != idempotent.Duplicate {
		t.Fatalf("pgx: %v, %v", o, err)
	}
}

// TestSeenPreCheck: with an in-process pre-check, a failed delivery is not
// recorded (its redelivery applies), a committed one is, and its
// redelivery is answered without the database.
func TestSeenPreCheck(t *testing.T) {
	t.Parallel()
	lru, err := idempotent.NewSeenLRU(100)
	if err != nil {
		t.Fatal(err)
	}
	p, s, m := setup(t, 4, idempgx.WithSeen(lru))
	ctx := context.Background()
	scope, err := m.Core().SeenScope(ctx)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if _, err := m.ProcessMessage(ctx, idempotent.Message{Key: "k"}, func(context.Context, pgx.Tx) error { return boom }); !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if lru.Seen(ctx, scope, "k") {
		t.Fatal("a rolled-back delivery was recorded")
	}
	if o, err := m.ProcessMessage(ctx, idempotent.Message{Key: "k"}, insertEffect(s, "k")); err != nil || o != idempotent.Applied {
		t.Fatalf("%v, %v; want applied", o, err)
	}
	if !lru.Seen(ctx, scope, "k") {
		t.Fatal("a committed delivery was not recorded")
	}
	// Drop the claim table: an answer now can only come from the pre-check.
	exec(t, p, "DROP TABLE "+s+".claims")
	if o, err := m.ProcessMessage(ctx, idempotent.Message{Key: "k"}, insertEffect(s, "k")); err != nil || o != idempotent.Duplicate {
		t.Fatalf("%v, %v; want duplicate from the pre-check", o, err)
	}
	if _, err := m.ProcessMessage(ctx, idempotent.Message{Key: "new"}, insertEffect(s, "new")); !errors.Is(err, idempotent.ErrNoClaimTable) {
		t.Fatalf("a new key: %v, want it sent to the (missing) claim table", err)
	}
}

// TestSeenPreCheckBatch: a batch claims only the keys the pre-check does not
// know, records the claimed ones after the commit and none of a batch that
// rolled back, and a batch it knows whole is answered without the database.
func TestSeenPreCheckBatch(t *testing.T) {
	t.Parallel()
	lru, err := idempotent.NewSeenLRU(100)
	if err != nil {
		t.Fatal(err)
	}
	p, s, m := setup(t, 4, idempgx.WithSeen(lru))
	ctx := context.Background()
	scope, err := m.Core().SeenScope(ctx)
	if err != nil {
		t.Fatal(err)
	}
	insert := func(keys []string) idempgx.BatchFunc {
		return func(ctx context.Context, tx pgx.Tx, fresh []int) error {
			for _, i := range fresh {
				if err := insertEffect(s, keys[i])(ctx, tx); err != nil {
					return err
				}
			}
			return nil
		}
	}
	boom := errors.New("boom")
	if _, err := m.ProcessMessages(ctx, keyMessages("a", "b"), func(context.Context, pgx.Tx, []int) error { return boom }); !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if lru.Seen(ctx, scope, "a") || lru.Seen(ctx, scope, "b") {
		t.Fatal("a rolled-back batch was recorded")
	}
	first := []string{"b", "a"}
	if outs, err := m.ProcessMessages(ctx, keyMessages(first...), insert(first)); err != nil || !slices.Equal(outs, []idempotent.Outcome{idempotent.Applied, idempotent.Applied}) {
		t.Fatalf("%v, %v; want both applied", outs, err)
	}
	// b's claim is gone from the table but the pre-check knows it: only a
	// and c go to the claim.
	exec(t, p, "DELETE FROM "+s+".claims WHERE message_key = 'b'")
	second := []string{"c", "b", "a"}
	outs, err := m.ProcessMessages(ctx, keyMessages(second...), insert(second))
	if err != nil || !slices.Equal(outs, []idempotent.Outcome{idempotent.Applied, idempotent.Duplicate, idempotent.Duplicate}) {
		t.Fatalf("%v, %v; want c applied, b from the pre-check, a from the claim", outs, err)
	}
	if !lru.Seen(ctx, scope, "c") {
		t.Fatal("a committed batch was not recorded")
	}
	// Drop the claim table: a batch it knows whole needs no database.
	exec(t, p, "DROP TABLE "+s+".claims")
	if outs, err := m.ProcessMessages(ctx, keyMessages(second...), insert(second)); err != nil || slices.Contains(outs, idempotent.Applied) {
		t.Fatalf("%v, %v; want three duplicates from the pre-check", outs, err)
	}
}

// TestHandlerLeavesRowsOpen: a handler that returns with a query's rows
// open leaves the claim's connection busy: its message fails at once, as
// the handler's own failure (not a lost connection, retried until the
// policy gives up), nothing of it commits, and the pool goes on.
func TestHandlerLeavesRowsOpen(t *testing.T) {
	t.Parallel()
	p, s, m := setup(t, 1, idempgx.WithRetry(idempotent.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))
	ctx := context.Background()
	runs := 0
	_, err := m.ProcessMessage(ctx, idempotent.Message{Key: "open"}, func(ctx context.Context, tx pgx.Tx) error {
		runs++
		if _, err := tx.Exec(ctx, "INSERT INTO "+s+".effects (id) VALUES ('open')"); err != nil {
			return err
		}
		return queryLeftOpen(ctx, tx)
	})
	var exhausted *idempotent.RetriesExhaustedError
	if err == nil || errors.As(err, &exhausted) || runs != 1 {
		t.Fatalf("err = %v after %d runs, want the handler's own failure after one", err, runs)
	}
	if n := count(t, p, "SELECT count(*) FROM "+s+".claims") + count(t, p, "SELECT count(*) FROM "+s+".effects"); n != 0 {
		t.Fatalf("%d claims and effects committed", n)
	}
	if out, err := m.ProcessMessage(ctx, idempotent.Message{Key: "open"}, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+s+".effects (id) VALUES ('open')")
		return err
	}); err != nil || out != idempotent.Applied {
		t.Fatalf("redelivered: (%v, %v), want applied", out, err)
	}
}

// TestOrderedMessageRefused: idempgx keeps no per-key order, so a message
// with an ordering key or sequence fails with ErrInvalidOrder, alone and in
// a batch, and nothing is written — never applied unchecked.
func TestOrderedMessageRefused(t *testing.T) {
	t.Parallel()
	p, s, m := setup(t, 2)
	ctx := context.Background()
	for name, msg := range map[string]idempotent.Message{
		"key and sequence": {Key: "o1", OrderKey: "acct-1", OrderSeq: 1},
		"sequence only":    {Key: "o2", OrderSeq: 2},
		"key only":         {Key: "o3", OrderKey: "acct-1"},
	} {
		if _, err := m.ProcessMessage(ctx, msg, insertEffect(s, msg.Key)); !errors.Is(err, idempotent.ErrInvalidOrder) {
			t.Errorf("%s: ProcessMessage: %v, want ErrInvalidOrder", name, err)
		}
		if _, err := m.ProcessMessages(ctx, []idempotent.Message{msg}, func(context.Context, pgx.Tx, []int) error { return nil }); !errors.Is(err, idempotent.ErrInvalidOrder) {
			t.Errorf("%s: ProcessMessages: %v, want ErrInvalidOrder", name, err)
		}
	}
	if n := count(t, p, "SELECT count(*) FROM "+s+".claims"); n != 0 {
		t.Errorf("%d claims written, want none", n)
	}
	if n := count(t, p, "SELECT count(*) FROM "+s+".effects"); n != 0 {
		t.Errorf("%d effects written, want none", n)
	}
}
