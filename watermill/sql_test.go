package watermill_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/lib/pq"

	idwm "github.com/txclaim/idempotent/watermill"

	"github.com/txclaim/idempotent/internal/testenv"
)

// subscriberTx returns the *sql.Tx the watermill-sql subscriber consumes the
// message in.
func subscriberTx(ctx context.Context) (*sql.Tx, bool) {
	tx, ok := wsql.TxFromContext(ctx)
	if !ok {
		return nil, false
	}
	std, ok := tx.(*wsql.StdSQLTx)
	if !ok {
		return nil, false
	}
	return std.Tx, true
}

// TestSQLSubscriberClaimEffectAndOffsetCommitTogether consumes from a
// watermill-sql topic in the subscriber's own transaction, which the
// subscriber shares among a batch of messages and keeps across a nack: a
// handler failure rolls back that attempt's claim and effect (to the
// savepoint), the message is resent and applied then; a republished message
// is a duplicate; claims, effects and offsets commit together.
func TestSQLSubscriberClaimEffectAndOffsetCommitTogether(t *testing.T) {
	t.Parallel()
	db := testenv.OpenPostgres(t, 6)
	l := newLedger(t, db, "loyalty")
	table := func(prefix string) func(string) string {
		return func(topic string) string {
			return pq.QuoteIdentifier(l.schema) + "." + pq.QuoteIdentifier(prefix+topic)
		}
	}
	schema := wsql.DefaultPostgreSQLSchema{GenerateMessagesTableName: table("watermill_"), SubscribeBatchSize: 10}
	offsets := wsql.DefaultPostgreSQLOffsetsAdapter{GenerateMessagesOffsetsTableName: table("watermill_offsets_")}
	pub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(db), wsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
		ConsumerGroup: "loyalty", SchemaAdapter: schema, OffsetsAdapter: offsets, InitializeSchema: true,
		PollInterval: 20 * time.Millisecond, RetryInterval: 10 * time.Millisecond, ResendInterval: 10 * time.Millisecond,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })

	var s settled
	r := newRouter(t)
	r.AddMiddleware(s.middleware)
	r.AddConsumerHandler("loyalty", "orders", sub, ours(t, l, l.handler(func(o order) bool { return o.OrderID%13 == 0 }), idwm.WithSubscriberTx(subscriberTx)))
	runRouter(t, r)

	orders := testenv.MakeOrders(300)
	msgs := withDuplicates(t, orders)
	if err := pub.Publish("orders", msgs...); err != nil {
		t.Fatal(err)
	}
	// The subscriber commits after the ack: wait for the last offset to be
	// committed. It reads only rows of transactions older than every
	// snapshot of the server (pg_snapshot_xmin), so a transaction another
	// session keeps open — another test's, on a shared server — holds it
	// back however long it lasts: the wait goes on while one does.
	started := time.Now()
	olderTransaction := func() string {
		var pid int
		var age time.Duration
		var seconds float64
		err := db.QueryRow(`SELECT pid, extract(epoch FROM now() - xact_start) FROM pg_stat_activity
WHERE (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL) AND pid <> pg_backend_pid() AND xact_start < $1 ORDER BY xact_start LIMIT 1`, started).Scan(&pid, &seconds)
		if err != nil {
			return ""
		}
		age = time.Duration(seconds * float64(time.Second))
		return fmt.Sprintf("the transaction of server process %d, open for %v", pid, age.Round(time.Second))
	}
	waitWhileProgressing(t, time.Minute, "every message acked and its offset committed", s.acked.Load, olderTransaction, func() (bool, error) {
		return s.acked.Load() == int64(len(msgs)) &&
			l.count(t, `SELECT count(*) FROM $S.watermill_offsets_orders o WHERE o.consumer_group = 'loyalty' AND o.offset_acked = (SELECT max("offset") FROM $S.watermill_orders)`) == 1, nil
	})
	t.Logf("%d messages (300 orders, %d published twice), %d handler failures rolled back to the savepoint and resent", len(msgs), len(msgs)-300, s.nacked.Load())
	if s.nacked.Load() != 300/13 {
		t.Errorf("%d nacks, want %d", s.nacked.Load(), 300/13)
	}
	l.audit(t, orders)
}
