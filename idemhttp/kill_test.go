package idemhttp_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/http"
	"os"
	osexec "os/exec"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idemhttp"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/postgres"
)

// childEnv names the claim and effects tables of a server subprocess.
const childEnv = "IDEMHTTP_TEST_CHILD"

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		runChild(spec)
		return
	}
	os.Exit(m.Run())
}

// runChild is the server subprocess of TestKilledMidHandler: it serves the
// app on loopback, prints its address, and in the handler applies the
// effect, says so, and waits to be killed.
func runChild(spec string) {
	claims, effects, _ := strings.Cut(spec, ",")
	die := func(err error) { fmt.Println("error", err); os.Exit(1) }
	db, err := sql.Open("postgres", testenv.Getenv("IDEMPOTENT_POSTGRES_DSN", testenv.DefaultPostgresDSN))
	if err != nil {
		die(err)
	}
	mw, err := idempotent.New(db, postgres.New(), "orders-api", idempotent.WithTable(claims), idempotent.WithLockTimeout(100*time.Millisecond))
	if err != nil {
		die(err)
	}
	h, err := idemhttp.New(mw, idemhttp.GlobalScope)
	if err != nil {
		die(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		die(err)
	}
	fmt.Println("addr", ln.Addr())
	die(http.Serve(ln, h.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx := idemhttp.TxFromContext(r.Context())
		if _, err := tx.ExecContext(r.Context(), "INSERT INTO "+effects+" (k, body) VALUES ($1, '{}')", r.Header.Get("X-Order")); err != nil {
			die(err)
		}
		fmt.Println("entered")
		select {}
	}))))
}

// TestKilledMidHandler: a server process is killed (SIGKILL) while its
// handler has applied the effect and not committed. The database rolls the
// claim's transaction back with the effect, so the client's retry, served
// by another process, applies the effect once and its retry is a replay.
func TestKilledMidHandler(t *testing.T) {
	if testing.Short() {
		t.Skip("subprocess test")
	}
	b := openBackend(t, "postgres")
	a := &app{b: b}
	_, h := b.middleware(t, idemhttp.GlobalScope)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := osexec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+b.claims+","+b.effects)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(out)
	line := func() string {
		if !lines.Scan() {
			t.Fatalf("the server process ended: %v", lines.Err())
		}
		return lines.Text()
	}
	addr, ok := strings.CutPrefix(line(), "addr ")
	if !ok {
		t.Fatalf("the server process did not start")
	}
	failed := make(chan error, 1)
	go func() {
		_, err := post(t, http.DefaultClient, "http://"+addr+"/orders", "killed", "o-killed", `{"n":1}`)
		failed <- err
	}()
	if l := line(); l != "entered" {
		t.Fatalf("server process: %s", l)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if err := <-failed; err == nil {
		t.Fatal("the killed server answered")
	}

	s := server(t, h.Wrap(a))
	var r response
	for range 100 { // until Postgres has seen the dead session and rolled it back
		r = mustPost(t, s.Client(), s.URL+"/orders", "killed", "o-killed", `{"n":1}`)
		if r.status != http.StatusConflict {
			break
		}
	}
	if r.status != http.StatusCreated || r.replayed {
		t.Fatalf("retry after the kill: %d replayed=%v %s", r.status, r.replayed, r.body)
	}
	again := mustPost(t, s.Client(), s.URL+"/orders", "killed", "o-killed", `{"n":1}`)
	if !again.replayed || again.body != r.body {
		t.Errorf("second retry: replayed=%v", again.replayed)
	}
	if n := b.count(t, "o-killed"); n != 1 || a.calls.Load() != 1 {
		t.Errorf("%d effects, %d runs here, want 1 and 1", n, a.calls.Load())
	}
}
