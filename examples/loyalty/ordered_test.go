package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
)

// checkOrderedAudit runs -ordered with args and checks its audit: the
// library applied every event once, in order, with no overdraft and
// nothing left parked, after parking some; the naive consumer applied
// some out of order (its deliveries are shuffled).
func checkOrderedAudit(t *testing.T, args ...string) {
	t.Helper()
	o := needParts(t, append([]string{"-ordered"}, args...)...)
	st, err := openStore(context.Background(), o.db, o.consumers*o.workers+2)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set: %v", err)
		}
		t.Skip(err)
	}
	defer st.cleanup()
	var out bytes.Buffer
	audits, err := orderedDemo(context.Background(), o, st, &out)
	if err != nil {
		t.Fatal(err)
	}
	naive, lib := audits[0], audits[1]
	if lib.applied != lib.events || lib.twice != 0 || lib.outOfOrder != 0 || lib.overdrafts != 0 || lib.leftParked != 0 || lib.parked == 0 {
		t.Errorf("the library's audit: %+v; want every event applied once, in order, no overdraft, some parked and none left\n%s", lib, out.String())
	}
	if naive.outOfOrder == 0 {
		t.Errorf("the naive audit shows no effect out of order: %+v\n%s", naive, out.String())
	}
	if !strings.Contains(out.String(), "idempotent WithOrdering") {
		t.Errorf("no audit line for the library:\n%s", out.String())
	}
}

func TestDemoOrderedEmbedded(t *testing.T) {
	checkOrderedAudit(t, "-orders", "400")
}

func TestDemoOrderedOnPostgres(t *testing.T) {
	dsn := os.Getenv("IDEMPOTENT_POSTGRES_DSN")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	checkOrderedAudit(t, "-orders", "400", "-db", dsn)
}

func TestDemoOrderedFlags(t *testing.T) {
	for _, args := range [][]string{{"-ordered", "-http"}, {"-ordered", "-broker", "nats"}, {"-ordered", "-amqp", "amqp://guest:guest@127.0.0.1:5672/"}} {
		if _, err := parseFlags(args, new(bytes.Buffer)); err == nil {
			t.Errorf("%q: accepted", args)
		}
	}
}
