package idemhttp_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idemhttp"
)

// largeHeaderLinks is how many Link fields bigHeader sets: with their
// JSON framing, more than the 65,535 bytes of a MySQL BLOB.
const largeHeaderLinks = 800

// bigHeader is a hook that answers a 201 with largeHeaderLinks stored Link
// fields, about 80 KB of them.
func bigHeader(w http.ResponseWriter, r *http.Request, call int64) bool {
	for i := range largeHeaderLinks {
		w.Header().Add("Link", fmt.Sprintf("</orders/%s/items/%06d>; rel=\"item\"; title=\"item %06d of the order, call %d\"", r.Header.Get("X-Order"), i, i, call))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order":%q,"call":%d}`, r.Header.Get("X-Order"), call)
	return true
}

// withLink stores the Link fields besides the default ones.
func withLink() idemhttp.Option {
	return idemhttp.WithStoredHeaders(append(slices.Clone(idemhttp.DefaultStoredHeaders), "Link")...)
}

// checkLargeHeader sends a request whose response has more than 64 KB of
// stored header fields, then its retry: the first is applied once and
// answered 201, the retry is its replay with every field intact. A failure
// of the first request that applied nothing would be acceptable too, but
// this package stores such a response: what may never happen is a
// committed effect whose retries cannot be answered.
func checkLargeHeader(t *testing.T, b *backend, c *http.Client, url, key, order string) {
	t.Helper()
	first := mustPost(t, c, url, key, order, `{}`)
	if first.status != http.StatusCreated || first.replayed || len(first.header.Values("Link")) != largeHeaderLinks {
		t.Fatalf("first: %d replayed=%v, %d Link fields, %q; want a fresh 201 with %d", first.status, first.replayed, len(first.header.Values("Link")), first.body, largeHeaderLinks)
	}
	for i := range 2 {
		again := mustPost(t, c, url, key, order, `{}`)
		if again.status != http.StatusCreated || !again.replayed || again.body != first.body {
			t.Fatalf("retry %d: %d replayed=%v %q; want the replay of 201 %q (%d effects committed)", i, again.status, again.replayed, again.body, first.body, b.count(t, order))
		}
		if !slices.Equal(again.header.Values("Link"), first.header.Values("Link")) {
			t.Errorf("retry %d: the stored Link fields differ from the first response's (%d fields, want %d)", i, len(again.header.Values("Link")), largeHeaderLinks)
		}
	}
	if n := b.count(t, order); n != 1 {
		t.Errorf("%d effects of %s, want 1", n, order)
	}
}

// TestLargeStoredHeader: a response with more than 64 KB of stored header
// fields is stored whole and replayed intact on every database, MariaDB in
// a strict and in a non-strict session included (a BLOB column refused it
// in the first and cut it short in the second, after which every retry of
// the committed request was a 500).
func TestLargeStoredHeader(t *testing.T) {
	for _, name := range []string{"postgres", "pgx", "mysql-strict", "mysql-nonstrict", "sqlite"} {
		t.Run(name, func(t *testing.T) {
			b := openBackend(t, name)
			a := &app{b: b, hook: bigHeader}
			_, h := b.middleware(t, idemhttp.GlobalScope, withLink())
			s := server(t, h.Wrap(a))
			checkLargeHeader(t, b, s.Client(), s.URL, "k-big", "o-big")
			if n := a.calls.Load(); n != 1 {
				t.Errorf("%d runs, want 1", n)
			}
		})
	}
}

// oldMySQLResponseTable is the response table as earlier versions of this
// package created it on MySQL and MariaDB: header fields in a BLOB.
const oldMySQLResponseTable = `CREATE TABLE processed_messages_http (
	consumer    VARBINARY(128)  NOT NULL,
	message_key VARBINARY(1024) NOT NULL,
	fingerprint VARBINARY(64)   NOT NULL,
	status      INT             NOT NULL,
	header      BLOB            NOT NULL,
	body        LONGBLOB        NOT NULL,
	created_at  BIGINT          NOT NULL,
	PRIMARY KEY (consumer, message_key),
	KEY processed_messages_http_created (created_at)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC`

// TestUpgradeMySQLHeaderColumn: EnsureSchema widens the header column of a
// response table made by an earlier version, keeping its stored responses,
// after which large header fields are stored whole in strict and
// non-strict sessions; a second EnsureSchema finds nothing to do.
func TestUpgradeMySQLHeaderColumn(t *testing.T) {
	for _, name := range []string{"mysql-strict", "mysql-nonstrict"} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			b := openBackend(t, name)
			exec(t, b.db, oldMySQLResponseTable)
			mw, err := idempotent.New(b.db, b.d, "orders-api", idempotent.WithTable(b.claims), idempotent.WithClock(b.clock.Now), idempotent.WithLockTimeout(100*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			if err := mw.EnsureSchema(ctx); err != nil {
				t.Fatal(err)
			}
			h, err := idemhttp.New(mw, idemhttp.GlobalScope, withLink())
			if err != nil {
				t.Fatal(err)
			}
			a := &app{b: b, hook: func(w http.ResponseWriter, r *http.Request, call int64) bool {
				if r.Header.Get("X-Order") == "o-big" {
					return bigHeader(w, r, call)
				}
				return false
			}}
			s := server(t, h.Wrap(a))
			c := s.Client()
			before := mustPost(t, c, s.URL, "k-old", "o-old", `{}`)
			if before.status != http.StatusCreated {
				t.Fatalf("a request on the earlier table: %d %s", before.status, before.body)
			}

			for range 2 {
				if err := h.EnsureSchema(ctx); err != nil {
					t.Fatal(err)
				}
				var typ string
				if err := b.db.QueryRow("SELECT LOWER(DATA_TYPE) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'processed_messages_http' AND COLUMN_NAME = 'header'").Scan(&typ); err != nil {
					t.Fatal(err)
				}
				if typ != "longblob" {
					t.Fatalf("after EnsureSchema the header column is a %s, want a longblob", typ)
				}
			}
			again := mustPost(t, c, s.URL, "k-old", "o-old", `{}`)
			if !again.replayed || again.body != before.body || again.header.Get("Location") != before.header.Get("Location") {
				t.Errorf("the response stored before the upgrade: %d replayed=%v %q, want the replay of %q", again.status, again.replayed, again.body, before.body)
			}
			checkLargeHeader(t, b, c, s.URL, "k-big", "o-big")
			if n := a.calls.Load(); n != 2 {
				t.Errorf("%d runs, want 2", n)
			}
		})
	}
}
