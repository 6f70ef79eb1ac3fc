package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/sqlite"
)

// TestCleanupOfABusyDatabaseIsErrCleanupBusy: a cleanup that cannot have
// the write lock (SQLite's cleanup lock) within the busy timeout and every
// retry stops with ErrCleanupBusy, not the driver's SQLITE_BUSY — as
// happens to one of several cleanups of a loaded machine. Here a writer
// holds the lock, from the start or from after the first batch, and the
// cleanup's connections wait 10ms.
func TestCleanupOfABusyDatabaseIsErrCleanupBusy(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "claims.db")
	db, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if err := must(idempotent.NewClaimTable(db, sqlite.New())).EnsureSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO processed_messages (consumer, message_key, processed_at) VALUES ('c', 'old1', '2000-01-01 00:00:00.000'), ('c', 'old2', '2000-01-01 00:00:00.000')"); err != nil {
		t.Fatal(err)
	}
	impatient, err := sql.Open(sqlite.DriverName, "file:"+path+"?_pragma=busy_timeout(10)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = impatient.Close() })
	tab := must(idempotent.NewClaimTable(impatient, sqlite.New(),
		idempotent.WithRetry(idempotent.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond})))

	// A writer holds the lock from the start: the horizon cannot be raised.
	holder := begin(t, db)
	n, err := tab.Cleanup(ctx, idempotent.DefaultCleanupOptions())
	_ = holder.Rollback()
	if !errors.Is(err, idempotent.ErrCleanupBusy) || n != 0 || !strings.Contains(err.Error(), "processed_messages") {
		t.Fatalf("Cleanup while a writer holds the lock = %d, %v; want 0 and ErrCleanupBusy naming the table", n, err)
	}
	// A writer comes between two batches.
	opts := idempotent.DefaultCleanupOptions()
	opts.BatchSize, opts.MinBatchSize = 1, 1
	opts.Progress = func(p idempotent.CleanupProgress) {
		if p.Batch == 1 {
			holder = begin(t, db)
		}
	}
	n, err = tab.Cleanup(ctx, opts)
	_ = holder.Rollback()
	if !errors.Is(err, idempotent.ErrCleanupBusy) || n != 1 {
		t.Fatalf("Cleanup with a writer after its first batch = %d, %v; want 1 and ErrCleanupBusy", n, err)
	}
	// Once the writer is gone, the next run deletes.
	if n, err := tab.Cleanup(ctx, idempotent.DefaultCleanupOptions()); err != nil || n != 1 {
		t.Fatalf("Cleanup after the writer left = %d, %v; want 1", n, err)
	}
}

func begin(t *testing.T, db *sql.DB) *sql.Tx {
	t.Helper()
	tx, err := db.Begin() // BEGIN IMMEDIATE: the write lock
	if err != nil {
		t.Fatal(err)
	}
	return tx
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
