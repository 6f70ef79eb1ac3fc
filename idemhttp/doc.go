// Package idemhttp makes a net/http handler's database effects happen once
// per Idempotency-Key, however many times a client retries: the
// Idempotency-Key middleware of the IETF draft
// draft-ietf-httpapi-idempotency-key-header (-06), built on the claim table
// of an [idempotent.Middleware].
//
// A client that timed out cannot know whether its POST was applied. It
// sends the request again with the same key; the middleware claims the key
// in a unique index, in the same database transaction as the handler's
// effect and the response it answered, so the three commit together or not
// at all. A retry finds the claim and gets the stored response, byte for
// byte, without the handler running.
//
//	mw, err := idempotent.New(db, postgres.New(), "orders-api", idempotent.WithLockTimeout(200*time.Millisecond))
//	idem, err := idemhttp.New(mw, accountOf) // accountOf: the request's principal
//	err = mw.EnsureSchema(ctx)                    // the claim table
//	err = idem.EnsureSchema(ctx)                  // the response table beside it
//	mux.Handle("POST /orders", idem.Wrap(createOrder))
//
// The handler does its database work through the claim's transaction,
// [TxFromContext](r.Context()), with the request's context, and does not
// commit it.
//
// # What each request gets
//
// A request of a protected method (WithMethods; POST and PATCH by default)
// is handled as follows; the repository's docs/http.md sets each case
// beside what the draft and Stripe do.
//
//   - No key header (WithHeader; Idempotency-Key by default): 400, an
//     application/problem+json (RFC 9457) body; WithOptionalKey lets it
//     through unprotected instead. More than one key field, an empty key or
//     a malformed quoted key: 400. The key may be sent as the draft's
//     Structured Field String ("abc", unquoted by the middleware) or bare
//     (abc, as Stripe's clients send it); both are the same key. A bare key
//     is the bytes as sent, less the SP and HTAB around a field value that
//     HTTP strips: "abc\u00a0" (a trailing no-break space) and "abc" are
//     two keys.
//   - A key the claim table cannot hold — invalid UTF-8, a NUL, longer
//     than the dialect's limit (1,024 bytes) less the scope and a few bytes
//     of framing — is refused like any invalid key ([idempotent.ErrInvalidKey]):
//     400, nothing written.
//   - First request of a key in its scope: the middleware claims it, runs
//     the handler with the claim's transaction in the request's context,
//     records status, header and body, stores status, the chosen header
//     fields (WithStoredHeaders; DefaultStoredHeaders; never Set-Cookie,
//     which WithStoredHeaders refuses) and the body with the request's
//     fingerprint in the response table — in that same transaction —,
//     commits, and only then writes the response, with every header field
//     the handler set. On every dialect the response table holds header
//     fields and a body of any size the database accepts in one statement
//     (see [Middleware.EnsureSchema] for a MySQL table made by an earlier
//     version). 2xx, 3xx and 4xx answers are
//     stored alike: a 4xx is the request's answer, and the retry of an
//     invalid request is just as invalid. A 4xx therefore commits whatever
//     the handler wrote through the transaction, as a 2xx does: validate
//     before writing.
//   - A 5xx answer, or a panic, rolls the transaction back: the effect,
//     the claim and the response are gone, the key is free, and the
//     client's retry runs the handler afresh — exactly once, because nothing
//     of the failed attempt committed. Stripe stores 500s instead, because
//     its effects cannot all be rolled back; here every effect the handler
//     made through the transaction is rolled back, so storing the 500 would
//     keep a failure that no longer has anything to protect.
//     WithStoredServerErrors stores and commits 5xx answers like the rest,
//     for handlers whose 5xx follows effects outside the database. A panic
//     propagates after the rollback (net/http then drops the connection).
//   - Retry of a completed request: the stored status, header fields and
//     body, byte for byte, with the [ReplayedHeader] field
//     (Idempotent-Replayed: true); the handler does not run. While replays
//     are frequent (more than a third of recent requests, by a score of
//     requests, not of time), the middleware reads the stored response
//     before claiming, in one statement that returns it only if its claim
//     exists: a replay is then one round trip, with no transaction, and a
//     request the read does not answer goes on to the claim (see
//     docs/http.md, "Replays in one round trip").
//   - Retry while the first request is in flight: 409 with Retry-After
//     (WithRetryAfter; 1s), decided within the Middleware's
//     [idempotent.WithLockTimeout], past which the claim gives
//     [idempotent.ErrClaimBusy]. New requires that option on a dialect that
//     has it; on MySQL its unit is the second, and on Postgres it also
//     bounds the handler's own lock waits. A retry in flight is a 409 even
//     when its request differs: its fingerprint can be compared only with a
//     stored response. SQLite cannot bound the wait:
//     the retry waits for the first request's transaction and then gets its
//     replay (or, the first having rolled back, runs the handler itself).
//   - The same key with a different request — another method, path or
//     query, body, or value of a fingerprint header field
//     (WithFingerprintHeaders; Content-Type by default) — after the first
//     completed: 422, nothing written. The fingerprint, a SHA-256 of those
//     parts, is stored with the response.
//   - A request body larger than WithMaxRequestBody (1 MiB), which the
//     middleware reads to fingerprint it: 413, the handler does not run.
//   - A response body larger than WithMaxResponseBody (1 MiB): the
//     handler's Write returns [ErrResponseTooLarge], the transaction rolls
//     back, the client gets a 500 problem, and the key stays free. Refusing
//     at the first request keeps every stored response whole; a truncated
//     replay would be worse than none.
//   - A database failure: 500 (503 with Retry-After once the core's retries
//     for serialization failures and lost connections are exhausted);
//     WithErrorLog hears of it.
//
// Requests of other methods pass through untouched, without a transaction
// (TxFromContext returns nil).
//
// # Scopes
//
// A [ScopeFunc] names the principal a request acts for, and each principal
// has its own key space: the claim's key is the scope and the client's key,
// length-prefixed, so a client that sends another's key runs its own
// request and can never read another's stored response, nor learn that the
// key is in use (it gets no 422 for it). There is no default: New needs
// one, because only the service knows how it authenticates, and a global
// default would hand one client's responses to another that guesses or
// reuses a key. [GlobalScope] is the explicit choice of a service with one
// client. A ScopeFunc error is a 403 Forbidden, or, with WithChallenge, a
// 401 Unauthorized carrying that WWW-Authenticate challenge (RFC 9110
// requires one on a 401, and only the service knows its scheme). An empty
// scope is answered the same way, unless the ScopeFunc is GlobalScope: a
// ScopeFunc that reads an API key header returns "" for a request without
// one, and every anonymous client would share one key space.
//
// # What the handler may do
//
// The handler runs with a buffered http.ResponseWriter: nothing reaches
// the client before the commit. The writer is no http.Flusher or
// http.Hijacker and has no Unwrap method, so http.ResponseController's
// Flush, Hijack and deadline methods fail with an error matching
// http.ErrNotSupported: a streaming response cannot be stored, and the
// part of it a client saw could not be taken back. Informational (1xx)
// statuses are dropped.
//
// Otherwise the writer records the response net/http's own would send, and
// stores that: the header is taken when the status is written
// (WriteHeader, or the first Write), so fields set later are not sent; a
// status without a body (204, 304) makes Write return
// http.ErrBodyNotAllowed; WriteHeader panics on a status outside 100–999,
// in the handler, so nothing of the request commits; and a Content-Type is
// sniffed from the body's first bytes (http.DetectContentType) when the
// handler set none — not even an empty one — and no Content-Encoding or
// Transfer-Encoding. A replay carries the same header fields.
//
// The claim's work does not end when the client hangs up: the request's
// context, in the handler, keeps its values but not the client's
// cancellation, so the effect and its response commit and the client's
// retry gets the replay. The core may run the handler more than once for
// one request when the claim's transaction suffered a serialization failure
// or lost its connection (see the idempotent package); only the attempt that
// commits answers.
//
// # Retention
//
// A stored response is replayed only while its claim exists: it is read
// after the claim is found, or read first together with its claim, and a
// new claim of the key overwrites it. The
// claim table's retention window (idempotent.WithRetention, 30 days by
// default) is therefore the window in which a retry is answered from the
// store; after the claim table's cleanup removed a claim, a retry of its key
// runs the handler again, as a new request. [Middleware.Cleanup] deletes the
// responses whose claims are gone, to give the space back; run it after the
// claim table's Cleanup.
//
// A claim table partitioned by event day ([idempotent.WithDailyPartitions])
// places each claim by its producer's event time; an HTTP request has none
// (its arrival time differs on every retry), so New refuses such a
// Middleware with [ErrPartitioned].
//
// # On pgx
//
// Package github.com/txclaim/idempotent/idemhttp/pgxhttp runs this
// middleware on an idempgx.Middleware: pgxhttp.New returns a *Middleware
// whose claim, handler effect and stored response commit in one pgx
// transaction, and the handler gets the claim's pgx.Tx from
// pgxhttp.TxFromContext (TxFromContext here gives nil to it).
//
//	m, err := idempgx.New(pool, "orders-api", idempgx.WithLockTimeout(200*time.Millisecond))
//	idem, err := pgxhttp.New(m, accountOf) // the Options of this package apply
//	mux.Handle("POST /orders", idem.Wrap(createOrder)) // createOrder: tx := pgxhttp.TxFromContext(r.Context())
//
// Every behaviour above is this package's, written once over a [Backend] —
// claim, run the request in the claim's transaction, store the response
// there through an [Exec] — of which New builds the database/sql one and
// pgxhttp the pgx one ([NewOn]). pgxhttp is a package of its own so that a
// service on database/sql compiles no pgx. A service on pgx's database/sql
// driver (sql.Open("pgx", dsn)) uses New, as on any driver.
//
// # Databases
//
// The response table has statements for the dialects the idempotent module
// ships: postgres, mysql (MySQL and MariaDB) and sqlite. For a migration
// tool instead of EnsureSchema, [SchemaSQL] returns the same DDL as the up
// and down of a migration. The Middleware's
// consumer name is the service's; give it a consumer of its own, shared
// with no broker consumer, since a claim without a stored response cannot
// be answered (500).
package idemhttp
