// Package pgxhttp is the Idempotency-Key middleware of package idemhttp
// for handlers built on pgx: the handler gets the claim's pgx.Tx (and so
// sqlc's pgx code, through Queries.WithTx), and the claim, the handler's
// effect and the stored response commit in one pgx transaction, taken by
// [idempgx.Middleware.ProcessMessage] on a *pgxpool.Pool.
//
//	m, err := idempgx.New(pool, "orders-api", idempgx.WithLockTimeout(200*time.Millisecond))
//	idem, err := pgxhttp.New(m, accountOf) // an *idemhttp.Middleware
//	err = m.EnsureSchema(ctx)              // the claim table
//	err = idem.EnsureSchema(ctx)           // the response table beside it
//	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
//		tx := pgxhttp.TxFromContext(r.Context()) // the claim's pgx.Tx
//		_, err := tx.Exec(r.Context(), "INSERT INTO orders …", …)
//		…
//	})
//	mux.Handle("POST /orders", idem.Wrap(createOrder))
//
// Everything a client sees is idemhttp's, the same on database/sql and on
// pgx: the key and its scope, the fingerprint and its 422, the 409 with
// Retry-After within the lock timeout, 5xx and panics rolled back with the
// key left free, the byte-for-byte replay, the body limits, the options
// (idemhttp.With…) and the errors. New returns an *idemhttp.Middleware, whose
// EnsureSchema and Cleanup run on the Core of the idempgx.Middleware (the
// same pool, through pgx's database/sql adapter); the claim's transaction
// and the read of a stored response for a replay run on the pgx pool.
// idemhttp.KeyFromContext gives the claim's key as on database/sql;
// idemhttp.TxFromContext gives nil.
//
// The stored response travels with COMMIT: the middleware queues its insert
// (idempgx.Queue) and idempgx sends it in COMMIT's round trip, so a request
// costs the round trips of its handler and two more — BEGIN with the claim,
// and the response with COMMIT — as many as the same handler in a
// transaction of its own (BEGIN, …, COMMIT). A handler that queues its own
// effects with idempgx.Queue(pgxhttp.TxFromContext(ctx), …) sends them in
// that round trip too. A response whose insert fails rolls back with the
// handler's effect, and the client gets a 500, the key left free.
//
// # Why a package of its own
//
// idemhttp's HTTP logic is written once, over a small [idemhttp.Backend]:
// claim and run in the claim's transaction, with an Exec to store the
// response there. idemhttp holds the database/sql Backend (idemhttp.New);
// this package holds the pgx one (about thirty lines) and TxFromContext.
// Putting them in idemhttp itself would make every database/sql service
// compile pgx and idempgx, and register the "pgx" database/sql driver by
// importing idemhttp. As a package of the idemhttp module, it costs those
// services only the lines of pgx in the module graph (go.mod, go.sum), as
// idemhttp's MariaDB and SQLite test drivers already do; in exchange,
// idemhttp's one behaviour suite runs every case on this Backend too, beside
// lib/pq, pgx's database/sql driver, MariaDB and SQLite, instead of a copy of
// it drifting here. A service on pgx's database/sql driver
// (sql.Open("pgx", dsn)) needs none of this: idemhttp.New works on it as on
// any database/sql driver.
package pgxhttp
