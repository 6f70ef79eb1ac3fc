package pgxhttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txclaim/idempotent/idemhttp/pgxhttp"
	"github.com/txclaim/idempotent/idempgx"
)

// accountOf is the service's authentication: the account a request acts
// for, set by the authentication middleware in front of the middleware.
func accountOf(r *http.Request) (string, error) {
	if a, ok := r.Context().Value(accountKey{}).(string); ok {
		return a, nil
	}
	return "", errors.New("not authenticated")
}

type accountKey struct{}

// An order API on pgx: POST /orders inserts the order through the claim's
// pgx.Tx, and a client that retries after a timeout gets the stored 201.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/shop?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	m, err := idempgx.New(pool, "orders-api", idempgx.WithLockTimeout(200*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	idem, err := pgxhttp.New(m, accountOf)
	if err != nil {
		log.Fatal(err)
	}
	for _, ensure := range []func(context.Context) error{m.EnsureSchema, idem.EnsureSchema} {
		if err := ensure(ctx); err != nil {
			log.Fatal(err)
		}
	}
	create := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var order struct {
			Item string `json:"item"`
		}
		if err := json.NewDecoder(r.Body).Decode(&order); err != nil {
			http.Error(w, "bad order", http.StatusBadRequest) // stored: a retry gets the same 400
			return
		}
		tx := pgxhttp.TxFromContext(r.Context()) // the claim's pgx.Tx
		var id int64
		if err := tx.QueryRow(r.Context(), "INSERT INTO orders (item) VALUES ($1) RETURNING id", order.Item).Scan(&id); err != nil {
			http.Error(w, "try again", http.StatusInternalServerError) // rolled back: the key is free
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
