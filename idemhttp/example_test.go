package idemhttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"net/http"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/idemhttp"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/postgres"
)

// accountOf is the service's authentication: the account a request acts
// for, set by the authentication middleware in front of idemhttp.
func accountOf(r *http.Request) (string, error) {
	if a, ok := r.Context().Value(accountKey{}).(string); ok {
		return a, nil
	}
	return "", errors.New("not authenticated")
}

type accountKey struct{}

// An order API whose POST /orders creates the order and enqueues its
// receipt e-mail in the claim's transaction: a client that retries after a
// timeout gets the stored 201, and the receipt is sent once, by the
// outbox's relay, with an idempotency key derived from the request's.
func Example() {
	db, err := idempotent.OpenGuarded("postgres", "postgres://postgres@127.0.0.1:5432/shop?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotent.New(db, postgres.New(), "orders-api", idempotent.WithLockTimeout(200*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	idem, err := idemhttp.New(mw, accountOf)
	if err != nil {
		log.Fatal(err)
	}
	receipts, err := outbox.New(db, "orders-api")
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	for _, ensure := range []func(context.Context) error{mw.EnsureSchema, idem.EnsureSchema, receipts.EnsureSchema} {
		if err := ensure(ctx); err != nil {
			log.Fatal(err)
		}
	}

	create := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx := idemhttp.TxFromContext(ctx) // the claim's transaction
		var order struct {
			Email string `json:"email"`
			Cents int64  `json:"cents"`
		}
		if err := json.NewDecoder(r.Body).Decode(&order); err != nil {
			http.Error(w, "bad order", http.StatusBadRequest) // a 4xx is stored: the retry gets it too
			return
		}
		var id int64
		if err := tx.QueryRowContext(ctx, "INSERT INTO orders (email, cents) VALUES ($1, $2) RETURNING id", order.Email, order.Cents).Scan(&id); err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable) // a 5xx rolls back: the key is free
			return
		}
		payload, _ := json.Marshal(map[string]any{"order": id, "email": order.Email})
		if _, err := receipts.Enqueue(ctx, tx, idemhttp.KeyFromContext(ctx), "send_receipt", payload); err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]int64{"id": id})
	})

	mux := http.NewServeMux()
	mux.Handle("POST /orders", idem.Wrap(create))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}

// The response table's upkeep: after the claim table's cleanup, Cleanup
// removes the stored responses whose claims it removed. A retry after that
// runs the handler again, so keep the claim table's retention window
// (idempotent.WithRetention) longer than any client retries.
func ExampleMiddleware_Cleanup() {
	var mw *idempotent.Middleware // the service's, with its claim table
	idem, err := idemhttp.New(mw, idemhttp.GlobalScope)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if _, err := mw.ClaimTable().Cleanup(ctx, idempotent.DefaultCleanupOptions()); err != nil {
		log.Fatal(err)
	}
	if _, err := idem.Cleanup(ctx, 0); err != nil {
		log.Fatal(err)
	}
}
