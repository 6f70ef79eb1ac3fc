package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"time"

	_ "github.com/lib/pq"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/outbox"
	"github.com/txclaim/idempotent/postgres"
)

// A receipts consumer claims each OrderCompleted message and, in the same
// transaction, enqueues the e-mail that a relay sends later.
func ExampleOutbox_Enqueue() {
	ctx := context.Background()
	db, err := sql.Open("postgres", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idempotent.New(db, postgres.New(), "receipts")
	if err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(db, mw.Config().Consumer)
	if err != nil {
		log.Fatal(err)
	}
	if err := ob.EnsureSchema(ctx); err != nil {
		log.Fatal(err)
	}

	key := "order-completed:9912"
	payload, _ := json.Marshal(map[string]any{"order_id": 9912, "to": "customer@example.com"})
	outcome, err := mw.ProcessMessage(ctx, idempotent.Message{Key: key}, func(ctx context.Context, tx *sql.Tx) error {
		_, err := ob.Enqueue(ctx, tx, key, "send_receipt", payload)
		return err
	})
	if err != nil {
		log.Fatal(err) // do not ack: the message is redelivered
	}
	fmt.Println(outcome) // ack the message
}

// A relay sends the receipts with the provider's Idempotency-Key header,
// wakes on every commit, and stops gracefully on interrupt.
func ExampleRelay_Run() {
	db, err := sql.Open("postgres", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	db.SetMaxOpenConns(4)
	ob, err := outbox.New(db, "receipts")
	if err != nil {
		log.Fatal(err)
	}
	sendReceipt := outbox.SenderFunc(func(ctx context.Context, m outbox.Message) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://mail.example.com/v1/send", bytes.NewReader(m.Payload))
		if err != nil {
			return outbox.Permanent(err)
		}
		req.Header.Set("Idempotency-Key", m.IdempotencyKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err // retried with the same key
		}
		defer resp.Body.Close()
		switch {
		case resp.StatusCode < 300:
			return nil
		case resp.StatusCode == http.StatusBadRequest:
			return outbox.Permanent(fmt.Errorf("mail provider: %s", resp.Status))
		}
		return fmt.Errorf("mail provider: %s", resp.Status)
	})
	relay, err := outbox.NewRelay(ob,
		outbox.WithSender("send_receipt", sendReceipt),
		outbox.WithListener(os.Getenv("DATABASE_URL")),
		outbox.WithMaxAttempts(10),
	)
	if err != nil {
		log.Fatal(err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	go func() {
		// Keep a week of sent rows, longer than the claims.
		tick := time.NewTicker(time.Hour)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if _, err := ob.Cleanup(ctx, 7*24*time.Hour); err != nil {
				log.Print(err)
			}
		}
	}()
	if err := relay.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// Key is how Enqueue derives a call's idempotency key: the same message,
// handled again, yields the same key.
func ExampleKey() {
	fmt.Println(outbox.Key("receipts", "order-completed:9912", "send_receipt"))
	// Output: 90b9a3d351a10dfcd053382f870f476cb1cc8109f9b0d20db23893aa89ca2a37
}

// New checks its arguments before anything reaches the database.
func ExampleNew() {
	db, _ := sql.Open("postgres", "")
	_, err := outbox.New(db, "receipts", outbox.WithTable("mail.out box"))
	fmt.Println(err)
	// Output: outbox: New: table name "mail.out box": invalid identifier: "out box" has ' ' at byte 3 (want letters, digits and underscores, not starting with a digit)
}

// A sender returns Permanent for a call that retrying cannot fix; the row is
// marked dead at once.
func ExamplePermanent() {
	err := outbox.Permanent(errors.New("card declined"))
	fmt.Println(errors.Is(err, outbox.ErrPermanent), err)
	// Output: true permanent: card declined
}

// An accounts service bumps the account's version and enqueues the event
// with it, in one transaction: a consumer created idempotent.WithOrdering
// applies each account's events in that order, whatever order the broker
// delivers them in.
func ExampleWithOrder() {
	ctx := context.Background()
	db, err := sql.Open("postgres", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(db, "accounts")
	if err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	var version int64
	if err := tx.QueryRowContext(ctx, "UPDATE accounts SET balance = balance - 40, version = version + 1 WHERE id = 42 RETURNING version").Scan(&version); err != nil {
		log.Fatal(err)
	}
	payload, _ := json.Marshal(map[string]any{"account": 42, "debit": 40})
	msgKey := fmt.Sprintf("account:42/%d", version)
	if _, err := ob.Enqueue(ctx, tx, msgKey, "account_event", payload, outbox.WithOrder("account:42", version)); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
}
