package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
)

// A TenantFunc names the tenant of a partition, for WithTenant: every
// record of the partition belongs to that tenant, whose database holds the
// partition's offset, its claims and its effects. An error stops the
// partition (adapter.EventStopped): it matches adapter.ErrPoison.
type TenantFunc func(topic string, partition int32) (string, error)

// WithTenant makes the Consumer apply each partition's records with its
// tenant's Middleware in ts, for tenants that each have a database of their
// own: tenant names the tenant of a partition (from a topic per tenant, or
// a fixed map of partitions to tenants). NewConsumer and NewBatchConsumer
// are then given a nil Middleware.
//
// The tenant is a partition's, not a record's, because the partition's
// offset advances in the transaction that claims and applies its record:
// it lives in one database, and a record of another tenant could not
// advance it in the same transaction. So every record of a partition goes
// to one tenant's database, which holds the partition's row of the offsets
// table (the table must exist in every tenant's database, as must the
// outbox table of WithDeadLetter, whose rows then wait in the tenant's
// database for a relay there). For the same reason a Middleware created
// WithCoalescing is refused with WithTenant: a coalesced transaction holds
// records of several partitions.
//
// A tenant whose database is down holds back its own partitions only: their
// records wait in place, requeued under the retry delay (adapter.EventRequeued)
// and never committed, while the other tenants' partitions go on; a
// partition assigned while its tenant's database is down starts once its
// stored offset can be read. Default: no tenants.
func WithTenant(ts *idempotent.Tenants, tenant TenantFunc) Option {
	return optionFunc(func(c *config) error {
		if ts == nil || tenant == nil {
			return errors.New("kafka: WithTenant: nil Tenants or tenant function")
		}
		if err := c.ac.SetTenant(ts, func(r *kgo.Record) (string, error) { return tenant(r.Topic, r.Partition) }); err != nil {
			return shared(err)
		}
		c.tenantSet, c.tenantOf = ts, tenant
		return nil
	})
}

// tenantConsumers holds, for a Consumer created WithTenant, one Consumer
// per tenant Middleware: each applies its tenant's partitions on the
// tenant's database, with its own prepared statements, and counts its
// events in the parent's counter.
type tenantConsumers struct {
	ts *idempotent.Tenants
	of TenantFunc

	mu   sync.Mutex
	subs map[*idempotent.Middleware]*Consumer
}

// tenantTopic keys the offsets read from one tenant's database.
type tenantTopic struct {
	tenant *Consumer
	topic  string
}

// forPartition returns the Consumer that applies p's records: c itself
// without WithTenant, else its tenant's. An error naming no tenant matches
// adapter.ErrPoison; one opening the tenant's database does not.
func (c *Consumer) forPartition(ctx context.Context, topic string, partition int32) (*Consumer, error) {
	if c.tenants == nil {
		return c, nil
	}
	name, err := c.tenants.of(topic, partition)
	if err == nil && name == "" {
		err = errors.New("empty tenant")
	}
	if err != nil {
		return nil, fmt.Errorf("kafka: %s: %w: tenant function: %w", partitionSource(topic, partition, -1), adapter.ErrPoison, err)
	}
	mw, err := c.tenants.ts.Middleware(ctx, name)
	if err != nil {
		return nil, err
	}
	c.tenants.mu.Lock()
	defer c.tenants.mu.Unlock()
	if sub := c.tenants.subs[mw]; sub != nil {
		return sub, nil
	}
	fn := "NewConsumer"
	if c.batch != nil {
		fn = "NewBatchConsumer"
	}
	sub, err := newPathConsumer(fn, mw, c.handle, c.batch, c.cfg, c.q, c.events)
	if err != nil {
		return nil, &idempotent.TenantError{Tenant: name, Err: err}
	}
	c.tenants.subs[mw] = sub
	return sub, nil
}

// tenantOffsets returns the stored offsets of topic in the database of
// partition's tenant, read once per tenant and topic in loaded.
func (c *Consumer) tenantOffsets(ctx context.Context, loaded map[tenantTopic]map[int32]storedOffset, topic string, partition int32) (map[int32]storedOffset, error) {
	sub, err := c.forPartition(ctx, topic, partition)
	if err != nil {
		return nil, err
	}
	k := tenantTopic{sub, topic}
	if have, ok := loaded[k]; ok {
		return have, nil
	}
	have, err := sub.loadOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	loaded[k] = have
	return have, nil
}

// tenant returns the Consumer of p's tenant, and p's state with its stored
// offset read from the tenant's database if it was not yet. done reports
// that the partition's records of this poll were settled instead (res
// says how): a partition naming no tenant is stopped; one whose tenant's
// database cannot be reached waits its retry delay, and its records are
// released and fetched again; one whose stored offset, now read, is not
// where the fetch began is rewound to it.
func (s *session) tenant(ctx context.Context, p tp, st partState, f *partFetch, res *partResult, stop, rebal <-chan struct{}) (c *Consumer, _ partState, done bool) {
	c, err := s.c.forPartition(ctx, p.topic, p.partition)
	var have map[int32]storedOffset
	if err == nil && st.unloaded {
		have, err = c.loadOffsets(ctx, p.topic)
	}
	if err != nil {
		if adapter.IsPoison(err) {
			s.stop(ctx, p, st.stored, adapter.Event{}, err)
			s.release(ctx, f.recs, nil)
			return nil, st, true
		}
		s.mu.Lock()
		attempt := 1
		if own, ok := s.owned[p]; ok {
			own.loads++
			attempt = own.loads
		}
		s.mu.Unlock()
		e := s.c.delivery(f.recs[0])
		_ = s.wait(ctx, []adapter.Event{e}, attempt, s.c.requeue(e.Message, err, attempt), stop, rebal)
		s.release(ctx, f.recs, nil)
		res.rewind, res.rewindTo = true, f.recs[0].Offset
		if st.stored >= 0 {
			res.rewindTo = st.stored
		}
		return nil, st, true
	}
	if !st.unloaded {
		return c, st, false
	}
	st.unloaded, st.loads = false, 0
	if row, ok := have[p.partition]; ok {
		st.stored, st.topicID = row.next, row.topicID
	}
	s.mu.Lock()
	if own, ok := s.owned[p]; ok {
		own.unloaded, own.loads, own.stored, own.topicID = false, 0, st.stored, st.topicID
	}
	s.mu.Unlock()
	if st.stored >= 0 && st.stored != f.recs[0].Offset {
		// The fetch began where a partition without a stored offset
		// starts; the stored offset is elsewhere.
		s.release(ctx, f.recs, nil)
		res.stored, res.rewind, res.rewindTo = st.stored, true, st.stored
		return nil, st, true
	}
	return c, st, false
}
