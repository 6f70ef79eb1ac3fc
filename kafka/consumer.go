package kafka

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/adapter"
	"github.com/txclaim/idempotent/internal/kafkaoffsets"
)

// Consumer consumes topics as a member of a Kafka consumer group and applies
// each record's effect exactly once, advancing the partition's offset in the
// database in the same transaction (see the package documentation). It is
// safe for concurrent use; Run may be called several times at once, each
// call one group member.
type Consumer struct {
	db       *sql.DB
	mw       *idempotent.Middleware
	path     *adapter.Path // the Middleware's own delivery path
	consumer string
	handle   Handler
	batch    BatchHandler
	cfg      config
	rule     adapter.Rule // the one settle rule, with WithRetryDelay's backoff
	q        kafkaoffsets.Statements
	events   *adapter.Counter // counts, then tells the Observer; shared with the tenants' Consumers

	// tenants, with WithTenant, holds each tenant's Consumer (tenantConsumers);
	// the Consumer itself then has no Middleware, database or path.
	tenants *tenantConsumers

	fold *adapter.Fold // the claim folded with the offset advance; nil: cannot

	// co coalesces NewConsumer's record transactions when the Middleware
	// was created WithCoalescing; nil otherwise. groupSQL is its groups'
	// offset advance (advanceAllSQL).
	co       *adapter.Coalesced
	groupSQL string
	applying atomic.Int32 // partitions whose next record may join a group now (see counted)

	prepMu   sync.Mutex
	prepared *sql.Stmt // the offset advance, prepared on first use
	folded   *sql.Stmt // the fold, prepared on first use
	grouped  *sql.Stmt // the group's offset advance, prepared on first use
}

// NewConsumer returns a Consumer that applies each record with h, one
// transaction per record, on mw's own delivery path: the offset advances in
// the claim's own transaction, on the database mw was created with (the
// offsets table must be in that database too), so mw's options apply to
// it as they do to ProcessMessage: its transaction options
// (idempotent.WithTxOptions), retry policy (idempotent.WithRetry), lock
// timeout (idempotent.WithLockTimeout), strict guard
// (idempotent.WithStrictGuard) and observer; its duplicate pre-check
// (idempotent.WithSeen) is never consulted (see the package documentation).
// Each record's key comes from its DefaultKeyHeader header unless WithKey
// says otherwise, and its event time from its adapter.EventTimeHeader
// header unless WithEventTime, WithTransportEventTime or WithoutEventTime
// says otherwise; a Middleware in partitioned mode refuses the last two
// with an error matching adapter.ErrNoProducerEventTime. The offsets rows
// are keyed by mw's consumer name: give each consumer group its own.
// NewConsumer sends nothing to the database or to Kafka; Run does. Only
// Postgres is supported.
func NewConsumer(mw *idempotent.Middleware, h Handler, opts ...Option) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("kafka: NewConsumer: nil handler")
	}
	return newConsumer("NewConsumer", mw, h, nil, opts)
}

// NewBatchConsumer returns a Consumer that applies the records of each poll
// for each partition in batches (of at most WithBatchSize records): one
// transaction claims a batch's records (as Middleware.ProcessMessages
// claims a batch, each record with its event time, see the package
// documentation, so a partitioned claim table works too), runs h once for
// the new ones, and advances the partition's offset once, past the last.
// It is the throughput path; see NewConsumer for the arguments, and for
// the Middleware options that apply.
func NewBatchConsumer(mw *idempotent.Middleware, h BatchHandler, opts ...Option) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("kafka: NewBatchConsumer: nil handler")
	}
	return newConsumer("NewBatchConsumer", mw, nil, h, opts)
}

func newConsumer(fn string, mw *idempotent.Middleware, h Handler, bh BatchHandler, opts []Option) (*Consumer, error) {
	cfg := defaultConfig(bh != nil)
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("kafka: %s: nil option", fn)
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	if err := cfg.ac.Check(mw); err != nil {
		return nil, err
	}
	var mwCfg idempotent.Config
	if cfg.tenantSet != nil {
		mwCfg = cfg.tenantSet.Config()
	} else {
		mwCfg = mw.Config()
	}
	if name := mwCfg.Dialect.Name(); name != "postgres" {
		return nil, fmt.Errorf("kafka: %s: the %s dialect is not supported: the offsets table is Postgres only", fn, name)
	}
	q, err := kafkaoffsets.New(cfg.offsetsTable)
	if err != nil {
		return nil, err
	}
	events := &adapter.Counter{Next: cfg.ac.Observer()}
	if cfg.tenantOf != nil {
		if mwCfg.Coalescing.Max > 0 {
			return nil, fmt.Errorf("kafka: %s: WithTenant and a Middleware created WithCoalescing: a coalesced transaction holds records of several partitions, which may belong to tenants of different databases; drop one of them", fn)
		}
		c := &Consumer{consumer: mwCfg.Consumer, handle: h, batch: bh, cfg: cfg, rule: cfg.ac.Rule(), q: q, events: events}
		c.tenants = &tenantConsumers{ts: cfg.tenantSet, of: cfg.tenantOf, subs: map[*idempotent.Middleware]*Consumer{}}
		return c, nil
	}
	return newPathConsumer(fn, mw, h, bh, cfg, q, events)
}

// newPathConsumer returns the Consumer applying records on mw's delivery
// path: the Consumer itself without WithTenant, one tenant's with it.
func newPathConsumer(fn string, mw *idempotent.Middleware, h Handler, bh BatchHandler, cfg config, q kafkaoffsets.Statements, events *adapter.Counter) (*Consumer, error) {
	path, err := adapter.NewPath(mw)
	if err != nil {
		return nil, fmt.Errorf("kafka: %s: %w", fn, err)
	}
	c := &Consumer{db: path.DB(), mw: mw, path: path, consumer: mw.Config().Consumer, handle: h, batch: bh, cfg: cfg,
		rule: cfg.ac.Rule(), q: q, fold: newFold(mw, q), events: events}
	if bh == nil {
		c.co, c.groupSQL = c.newCoalesced(), advanceAllSQL(q.Quoted)
	}
	return c, nil
}

// Stats returns the counts of the Consumer's events so far, over all its
// Runs: every record it finished is in exactly one of Applied, Duplicates
// and DeadLettered (dropped ones too); Requeued counts in-place retries,
// Released records given up unapplied (to a rebalance, a shutdown, a
// stopped partition), Assigned the assignments received.
func (c *Consumer) Stats() adapter.Stats { return c.events.Stats() }

// Run joins the consumer group configured in clientOpts (kgo.ConsumerGroup
// and kgo.ConsumeTopics are required, with the seed brokers) and consumes
// until ctx ends or the client fails.
//
// Run adds its own options after clientOpts, which replace the same options
// given there: kgo.BlockRebalanceOnPoll, kgo.DisableAutoCommit,
// kgo.AdjustFetchOffsetsFn (to seek each assigned partition to the offset
// stored in the database, or, where none is stored, to the WithResetPosition
// position), kgo.OnPartitionsRevoked, kgo.OnPartitionsLost,
// kgo.OnPartitionsCallbackBlocked,
// kgo.FetchIsolationLevel(kgo.ReadCommitted()) (records of aborted Kafka
// transactions are never applied, nor those of transactions still open)
// and kgo.ConsumeResetOffset(kgo.NoResetOffset()) (the client never moves a
// partition on its own when its offset falls out of the log: the Consumer
// stops the partition instead, see adapter.EventStopped). Any balancer
// works.
//
// Each poll's records are split by partition; partitions are processed
// concurrently by up to WithWorkers goroutines, the records of one partition
// in offset order. Before applying a partition's records the Consumer checks
// that its log still continues from the stored offset — the topic ID is the
// one stored with the offset, the log start is not above the stored offset,
// neither the high watermark nor the first record fetched below it — and
// otherwise stops the partition (ErrLogGap). The group cannot rebalance
// until the poll's work is done: when a rebalance is waiting, records not
// yet started are released (adapter.EventReleased: read again, by whichever
// member owns the partition next, from the stored offset) while
// transactions in flight finish. After the database commits, the offsets are also committed to
// Kafka, asynchronously, for lag tools only.
//
// When ctx ends Run shuts down gracefully: transactions in flight finish
// (with a context that is not cancelled, for up to WithShutdownTimeout),
// nothing new starts, the offsets are committed to Kafka, and the member
// leaves the group; Run returns nil. It returns an error matching ErrClient
// when the client cannot be created or fails for good, and an error naming
// the missing option when clientOpts configure no group or no topics. A
// panic in the handler is not recovered.
func (c *Consumer) Run(ctx context.Context, clientOpts ...kgo.Opt) error {
	if ctx.Err() != nil {
		return nil
	}
	s := &session{c: c, owned: map[tp]*partState{}}
	s.rebal = make(chan struct{})
	opts := append(slices.Clip(clientOpts),
		kgo.BlockRebalanceOnPoll(),
		kgo.DisableAutoCommit(),
		kgo.AdjustFetchOffsetsFn(s.adjust),
		kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, m map[string][]int32) {
			s.drop(ctx, cl, adapter.EventRevoked, m)
		}),
		kgo.OnPartitionsLost(func(ctx context.Context, cl *kgo.Client, m map[string][]int32) { s.drop(ctx, cl, adapter.EventLost, m) }),
		kgo.OnPartitionsCallbackBlocked(func(context.Context, *kgo.Client) { s.rebalanceWaiting() }),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
	)
	// The options given must name a group and topics; a client built from
	// them alone (it connects to nothing until used) says whether they do.
	probe, err := kgo.NewClient(clientOpts...)
	if err != nil {
		return fmt.Errorf("%w: new client: %w", ErrClient, err)
	}
	group, _ := probe.OptValue(kgo.ConsumerGroup).(string)
	topics, _ := probe.OptValue(kgo.ConsumeTopics).([]string)
	probe.Close()
	if group == "" {
		return errors.New("kafka: Run: no consumer group: pass kgo.ConsumerGroup")
	}
	if len(topics) == 0 {
		return errors.New("kafka: Run: no topics: pass kgo.ConsumeTopics")
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("%w: new client: %w", ErrClient, err)
	}

	// Transactions run with a context that outlives ctx, so that a shutdown
	// lets them commit; it ends after the shutdown timeout, or when Run
	// returns.
	hctx, hcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hcancel()
	stop := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			close(stop)
			t := time.AfterFunc(c.cfg.ac.ShutdownTimeout(), hcancel)
			<-hctx.Done()
			t.Stop()
		case <-hctx.Done():
		}
	}()

	var runErr error
	for {
		fetches := cl.PollRecords(ctx, c.cfg.maxPoll)
		if ctx.Err() != nil {
			break
		}
		fetches = c.topUp(cl, fetches)
		if fetches.IsClientClosed() {
			runErr = fmt.Errorf("%w: closed while consuming", ErrClient)
			break
		}
		if err := s.fetchErrors(ctx, cl, fetches); err != nil {
			runErr = err
			break
		}
		rewind, commit := s.round(hctx, fetches, stop)
		if len(rewind) > 0 {
			cl.SetOffsets(rewind)
		}
		if p := s.takePauses(); len(p) > 0 {
			cl.PauseFetchPartitions(p)
		}
		if len(commit) > 0 {
			cl.CommitOffsets(hctx, commit, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
				s.commitDone(hctx, resp, err)
			})
		}
		cl.AllowRebalance()
		select {
		case <-stop:
		default:
			continue
		}
		break
	}
	if final := s.lastCommits(); len(final) > 0 && runErr == nil {
		cctx, cancel := context.WithTimeout(hctx, c.cfg.ac.ShutdownTimeout())
		cl.CommitOffsetsSync(cctx, final, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			s.commitDone(hctx, resp, err)
		})
		cancel()
	}
	cl.CloseAllowingRebalance()
	return runErr
}

// topUp adds to a poll's fetches more of what the client has buffered,
// without waiting, while the poll was full and its records are of fewer
// partitions than workers, up to WithWorkers polls in all. The client hands
// out buffered records partition by partition, so a backlog's poll is
// often one or two partitions' records, and the round, which applies one
// partition per worker, would leave the other workers idle. The records of
// a partition in later polls follow those of earlier ones.
func (c *Consumer) topUp(cl *kgo.Client, fetches kgo.Fetches) kgo.Fetches {
	workers := c.cfg.ac.Workers()
	last := fetches.NumRecords()
	for range workers - 1 {
		if last < c.cfg.maxPoll || partitionsIn(fetches) >= workers {
			break
		}
		// With a nil context PollRecords returns at once with what is
		// buffered, as its documentation says.
		more := cl.PollRecords(nil, c.cfg.maxPoll) //nolint:staticcheck // nil: poll without waiting
		fetches = append(fetches, more...)
		last = more.NumRecords()
	}
	return fetches
}

// partitionsIn returns how many partitions fetches hold records of.
func partitionsIn(fetches kgo.Fetches) int {
	seen := map[tp]bool{}
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) > 0 {
			seen[tp{p.Topic, p.Partition}] = true
		}
	})
	return len(seen)
}

// fetchErrors reports the fetch errors of a poll to the observer, stops the
// partitions whose records the client says are lost, and returns the first
// error retrying cannot fix.
func (s *session) fetchErrors(ctx context.Context, cl *kgo.Client, fetches kgo.Fetches) error {
	for _, fe := range fetches.Errors() {
		if errors.Is(fe.Err, context.Canceled) || errors.Is(fe.Err, context.DeadlineExceeded) {
			continue
		}
		if errors.Is(fe.Err, kgo.ErrClientClosed) {
			return fmt.Errorf("%w: %w", ErrClient, fe.Err)
		}
		var dl *kgo.ErrDataLoss
		if errors.As(fe.Err, &dl) || errors.Is(fe.Err, kerr.OffsetOutOfRange) {
			// With NoResetOffset the client stops at an offset out of the
			// log; a *ErrDataLoss says it found the log truncated under
			// what it consumed and moved the cursor. Either way records
			// may be gone: stop the partition rather than go on.
			if !s.stopLost(ctx, cl, tp{fe.Topic, fe.Partition}, fe.Err) {
				// Not this member's partition (any more): its next owner
				// checks the log itself.
				s.c.observe(ctx, adapter.Event{Type: adapter.EventFetchError, Source: fetchSource(fe.Topic, fe.Partition), Err: fe.Err})
			}
			continue
		}
		var ke *kerr.Error
		var gs *kgo.ErrGroupSession
		if errors.As(fe.Err, &ke) && !ke.Retriable && !errors.As(fe.Err, &gs) {
			return fmt.Errorf("%w: topic %q partition %d: %w", ErrClient, fe.Topic, fe.Partition, fe.Err)
		}
		s.c.observe(ctx, adapter.Event{Type: adapter.EventFetchError, Source: fetchSource(fe.Topic, fe.Partition), Err: fe.Err})
	}
	return nil
}

func (c *Consumer) observe(ctx context.Context, e adapter.Event) { c.events.Observe(ctx, e) }

// stops reports whether err stops the partition instead of being retried:
// its log does not continue from the stored offset, or a handler ended the
// transaction itself (the claim and offset may have committed without the
// effect: retrying would find the offset moved and go on as if nothing had
// happened).
func stops(err error) bool {
	return errors.Is(err, ErrLogGap) || errors.Is(err, idempotent.ErrAutocommit)
}

// startWithout is where a partition with no stored offset starts, given
// the offset the group's Kafka commit (or the client's start offset) says.
func (c *Consumer) startWithout(group kgo.Offset) kgo.Offset {
	if c.cfg.adopt && group.EpochOffset().Offset >= 0 {
		return group
	}
	if c.cfg.reset == ResetLatest {
		return kgo.NewOffset().AtEnd()
	}
	return kgo.NewOffset().AtStart()
}

// tp names a partition.
type tp struct {
	topic     string
	partition int32
}

// partState is what a session knows of a partition it owns.
type partState struct {
	stored int64 // stored next offset, -1 when none is stored
	// unloaded: the stored offset is not known yet, as the tenant's
	// database could not be read when the partition was assigned
	// (WithTenant); loads counts the failed attempts since.
	unloaded bool
	loads    int
	// retryAt is the offset of the record (or batch's first) that last
	// yielded its poll after a failed attempt (WithTenant), retries how
	// many attempts it has had.
	retryAt int64
	retries int
	topicID string // topic ID stored with it, "" when none is
	epoch   int32  // leader epoch of the last record applied, -1 when none
	stopped bool   // stopped (EventStopped): nothing more is applied
}

// session is one Run: the partitions this member owns and what it last
// read or wrote of them.
type session struct {
	c      *Consumer
	mu     sync.Mutex
	owned  map[tp]*partState
	pauses map[string][]int32 // partitions stopped since the loop last paused them
	rebal  chan struct{}      // closed when a rebalance waits for this poll's work
}

// adjust is the AdjustFetchOffsetsFn: it replaces the offsets the client
// would start from with the ones stored in the database, and where none is
// stored with the reset position (or, WithAdoptGroupOffsets, the group's
// Kafka commit).
func (s *session) adjust(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	stored := map[string]map[int32]int64{}
	parts := map[string][]int32{}
	states := map[tp]*partState{}
	loaded := map[tenantTopic]map[int32]storedOffset{}
	for topic, ps := range offsets {
		var have map[int32]storedOffset
		if s.c.tenants == nil {
			var err error
			if have, err = s.c.loadOffsets(ctx, topic); err != nil {
				return nil, err
			}
		}
		stored[topic] = map[int32]int64{}
		for p, o := range ps {
			parts[topic] = append(parts[topic], p)
			st := &partState{stored: -1, epoch: -1}
			if s.c.tenants != nil {
				// Each partition's offset is in its tenant's database. One
				// that cannot be read now (the tenant's database is down)
				// is read before the partition's first record is applied
				// (session.loadTenant); the others start at once.
				var err error
				if have, err = s.c.tenantOffsets(ctx, loaded, topic, p); err != nil {
					st.unloaded = true
					ps[p] = s.c.startWithout(o)
					stored[topic][p] = st.stored
					states[tp{topic, p}] = st
					continue
				}
			}
			if row, ok := have[p]; ok {
				st.stored, st.topicID = row.next, row.topicID
				ps[p] = kgo.NewOffset().At(row.next).WithEpoch(-1)
			} else {
				ps[p] = s.c.startWithout(o)
			}
			stored[topic][p] = st.stored
			states[tp{topic, p}] = st
		}
		slices.Sort(parts[topic])
	}
	s.mu.Lock()
	maps.Copy(s.owned, states)
	s.mu.Unlock()
	s.c.observe(ctx, adapter.Event{Type: adapter.EventAssigned, Detail: Rebalance{Partitions: parts, Offsets: stored}})
	return offsets, nil
}

// drop forgets revoked or lost partitions, and lets the client fetch again
// those it stopped, for whenever they are assigned next.
func (s *session) drop(ctx context.Context, cl *kgo.Client, typ adapter.EventType, m map[string][]int32) {
	if len(m) == 0 {
		return
	}
	resume := map[string][]int32{}
	s.mu.Lock()
	for topic, ps := range m {
		for _, p := range ps {
			if st, ok := s.owned[tp{topic, p}]; ok && st.stopped {
				resume[topic] = append(resume[topic], p)
			}
			delete(s.owned, tp{topic, p})
		}
	}
	s.mu.Unlock()
	if len(resume) > 0 {
		cl.ResumeFetchPartitions(resume)
	}
	parts := make(map[string][]int32, len(m))
	for topic, ps := range m {
		parts[topic] = slices.Sorted(slices.Values(ps))
	}
	s.c.observe(ctx, adapter.Event{Type: typ, Detail: Rebalance{Partitions: parts}})
}

func (s *session) rebalanceWaiting() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.rebal:
	default:
		close(s.rebal)
	}
}

// state returns a copy of what the session knows of p, if it owns p.
func (s *session) state(p tp) (partState, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.owned[p]
	if !ok {
		return partState{}, false
	}
	return *st, true
}

func (s *session) setStored(p tp, o int64, epoch int32, topicID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.owned[p]; ok {
		st.stored, st.epoch = o, epoch
		if st.topicID == "" {
			st.topicID = topicID // the advance stored it
		}
	}
}

// stop stops p, if the session owns it and it is not stopped yet: nothing
// more of it is applied, and the loop pauses its fetching. The observer is
// told, with e's message and record when the stop concerns one, and the
// offset as the Source.
func (s *session) stop(ctx context.Context, p tp, offset int64, e adapter.Event, err error) {
	s.mu.Lock()
	st, ok := s.owned[p]
	if !ok || st.stopped {
		s.mu.Unlock()
		return
	}
	st.stopped = true
	if s.pauses == nil {
		s.pauses = map[string][]int32{}
	}
	s.pauses[p.topic] = append(s.pauses[p.topic], p.partition)
	s.mu.Unlock()
	e.Type, e.Source, e.Err = adapter.EventStopped, partitionSource(p.topic, p.partition, offset), err
	s.c.observe(ctx, e)
}

// stopLost stops p after the client reported lost records (cause), with
// the log's bounds as the cluster gives them now, and reports whether the
// session owns p.
func (s *session) stopLost(ctx context.Context, cl *kgo.Client, p tp, cause error) bool {
	st, ok := s.state(p)
	if !ok {
		return false
	}
	start, end := logBounds(ctx, cl, p)
	s.stop(ctx, p, st.stored, adapter.Event{}, &LogGapError{Topic: p.topic, Partition: p.partition, Stored: st.stored, LogStart: start, HighWatermark: end, First: -1, StoredTopicID: st.topicID, Err: cause})
	return true
}

// logBoundsTimeout bounds logBounds, which the poll loop waits for.
const logBoundsTimeout = 5 * time.Second

// logBounds asks the cluster for p's log start offset and high watermark,
// -1 for what it cannot learn.
func logBounds(ctx context.Context, cl *kgo.Client, p tp) (start, end int64) {
	ctx, cancel := context.WithTimeout(ctx, logBoundsTimeout)
	defer cancel()
	bound := func(ts int64) int64 {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp, rp.CurrentLeaderEpoch = p.partition, ts, -1
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic, rt.Partitions = p.topic, []kmsg.ListOffsetsRequestTopicPartition{rp}
		req := kmsg.NewPtrListOffsetsRequest()
		req.ReplicaID, req.Topics = -1, []kmsg.ListOffsetsRequestTopic{rt}
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return -1
		}
		for _, t := range resp.Topics {
			for _, rp := range t.Partitions {
				if t.Topic == p.topic && rp.Partition == p.partition && rp.ErrorCode == 0 {
					return rp.Offset
				}
			}
		}
		return -1
	}
	return bound(-2), bound(-1)
}

// takePauses returns the partitions stopped since the last call.
func (s *session) takePauses() map[string][]int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pauses
	s.pauses = nil
	return p
}

// lastCommits returns the stored offsets of the owned partitions that have
// one, for the final commit to Kafka.
func (s *session) lastCommits() map[string]map[int32]kgo.EpochOffset {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]map[int32]kgo.EpochOffset{}
	for p, st := range s.owned {
		if st.stored < 0 {
			continue
		}
		if out[p.topic] == nil {
			out[p.topic] = map[int32]kgo.EpochOffset{}
		}
		out[p.topic][p.partition] = kgo.EpochOffset{Epoch: st.epoch, Offset: st.stored}
	}
	return out
}

func (s *session) commitDone(ctx context.Context, resp *kmsg.OffsetCommitResponse, err error) {
	if err != nil {
		s.c.observe(ctx, adapter.Event{Type: adapter.EventCommitFailed, Err: err})
		return
	}
	if resp == nil {
		return
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				s.c.observe(ctx, adapter.Event{Type: adapter.EventCommitFailed, Source: fetchSource(t.Topic, p.Partition), Err: err})
			}
		}
	}
}

// partFetch is one poll's fetch of one partition.
type partFetch struct {
	recs    []*kgo.Record
	topicID string // as the fetch reported it, "" when it did not
	// logStart and firstHW are those of the poll's first fetch of the
	// partition, which the stored offset is checked against; hw is the
	// last one's, for the lag.
	logStart, firstHW, hw int64
}

// partResult is what one partition's work in a poll came to.
type partResult struct {
	p        tp
	done     int   // how many of the fetch's records were settled, in order
	advanced bool  // the stored offset moved
	stored   int64 // the stored offset now
	epoch    int32
	rewind   bool  // the client must fetch again from rewindTo
	rewindTo int64 // the stored offset, or the first record's when none is stored
}

// round processes one poll's records and returns the partitions to rewind
// and the offsets to commit to Kafka.
func (s *session) round(ctx context.Context, fetches kgo.Fetches, stop <-chan struct{}) (rewind, commit map[string]map[int32]kgo.EpochOffset) {
	s.mu.Lock()
	select {
	case <-s.rebal:
		s.rebal = make(chan struct{})
	default:
	}
	rebal := s.rebal
	s.mu.Unlock()

	var order []tp
	parts := map[tp]*partFetch{}
	fetches.EachTopic(func(t kgo.FetchTopic) {
		id := formatTopicID(t.TopicID)
		t.EachPartition(func(p kgo.FetchPartition) {
			if len(p.Records) == 0 {
				return
			}
			k := tp{t.Topic, p.Partition}
			f, ok := parts[k]
			if !ok {
				f = &partFetch{topicID: id, logStart: p.LogStartOffset, firstHW: p.HighWatermark}
				parts[k] = f
				order = append(order, k)
			}
			f.recs = append(f.recs, p.Records...)
			f.hw = p.HighWatermark
		})
	})
	results := make([]partResult, len(order))
	sem := make(chan struct{}, s.c.cfg.ac.Workers())
	finished := s.c.counted(len(order), s.c.cfg.ac.Workers())
	var wg sync.WaitGroup
	for i, p := range order {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			defer finished()
			results[i] = s.partition(ctx, p, parts[p], stop, rebal)
		})
	}
	wg.Wait()
	for _, r := range results {
		switch {
		case r.rewind:
			if rewind == nil {
				rewind = map[string]map[int32]kgo.EpochOffset{}
			}
			if rewind[r.p.topic] == nil {
				rewind[r.p.topic] = map[int32]kgo.EpochOffset{}
			}
			rewind[r.p.topic][r.p.partition] = kgo.EpochOffset{Epoch: -1, Offset: r.rewindTo}
		case r.advanced:
			if commit == nil {
				commit = map[string]map[int32]kgo.EpochOffset{}
			}
			if commit[r.p.topic] == nil {
				commit[r.p.topic] = map[int32]kgo.EpochOffset{}
			}
			commit[r.p.topic][r.p.partition] = kgo.EpochOffset{Epoch: r.epoch, Offset: r.stored}
		}
	}
	return rewind, commit
}

// checkLog returns the *LogGapError of a partition whose fetch f shows that
// its log does not continue from the stored offset st.stored, or nil. A
// first record above the stored offset is not a gap by itself: transaction
// markers, aborted records (under read-committed) and compaction all leave
// offsets without a record to read; only a log start above the stored
// offset says records were deleted.
func checkLog(p tp, st partState, f *partFetch) *LogGapError {
	if st.stored < 0 {
		return nil // nothing stored: nothing to continue from
	}
	first := f.recs[0].Offset
	reID := st.topicID != "" && f.topicID != "" && st.topicID != f.topicID
	if !reID && f.logStart <= st.stored && (f.firstHW < 0 || f.firstHW >= st.stored) && first >= st.stored {
		return nil
	}
	return &LogGapError{Topic: p.topic, Partition: p.partition, Stored: st.stored, LogStart: f.logStart, HighWatermark: f.firstHW,
		First: first, StoredTopicID: st.topicID, TopicID: f.topicID}
}

// errAbandoned ends a partition's work of a poll because the shutdown or a
// rebalance is waiting; the records left are released.
var errAbandoned = errors.New("kafka: abandoned")

// errYield ends a partition's work of a poll after a record's failed
// attempt and its retry delay, with WithTenant: the records left are
// released and fetched again from the stored offset, so that a tenant whose
// database is down does not hold the poll, and the other tenants'
// partitions, behind its records. The attempts are counted on
// (session.attempts).
var errYield = errors.New("kafka: partition yields its poll")

// attempts returns how many attempts the record at offset of p has had in
// earlier polls (see errYield).
func (s *session) attempts(p tp, offset int64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.owned[p]; ok && st.retries > 0 && st.retryAt == offset {
		return st.retries
	}
	return 0
}

// yield records attempt, failed, of the record at offset of p, and returns
// errYield when the Consumer yields a partition's poll after a failed
// attempt (WithTenant); nil when the record waits in place instead.
func (s *session) yield(p tp, offset int64, attempt int) error {
	if s.c.tenants == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.owned[p]; ok {
		st.retryAt, st.retries = offset, attempt
	}
	return errYield
}

// stopError carries an error that stops the partition (see stops) out of
// records and batches, with the event of the record it concerns.
type stopError struct {
	err    error
	offset int64
	event  adapter.Event
}

func (e *stopError) Error() string { return e.err.Error() }
func (e *stopError) Unwrap() error { return e.err }

// partition applies one partition's records of a poll. Every record of the
// fetch ends in one event: applied, duplicate or dead-lettered when it was
// settled, released when it was not (the partition is not owned or is
// stopped, or was fenced, or the shutdown or a rebalance is waiting).
func (s *session) partition(ctx context.Context, p tp, f *partFetch, stop, rebal <-chan struct{}) partResult {
	st, ok := s.state(p)
	res := partResult{p: p, stored: st.stored, epoch: -1}
	if !ok || st.stopped {
		s.release(ctx, f.recs, nil)
		return res
	}
	c := s.c
	if s.c.tenants != nil {
		var done bool
		if c, st, done = s.tenant(ctx, p, st, f, &res, stop, rebal); done {
			return res
		}
	}
	if gap := checkLog(p, st, f); gap != nil {
		s.stop(ctx, p, st.stored, adapter.Event{}, gap)
		s.release(ctx, f.recs, nil)
		return res
	}
	var err error
	if c.batch != nil {
		err = s.batches(ctx, c, &res, f, stop, rebal)
	} else {
		err = s.records(ctx, c, &res, f.recs, f, c.handle, stop, rebal)
	}
	var se *stopError
	switch {
	case err == nil:
	case errors.As(err, &se):
		offset := se.offset
		var gap *LogGapError
		if errors.As(se.err, &gap) {
			offset = gap.Stored
		}
		s.release(ctx, f.recs[res.done:], se.err)
		s.stop(ctx, p, offset, se.event, se.err)
	default:
		// Fetch the partition again from the stored offset: the client's
		// position is past records that were not applied. With no stored
		// offset, nothing of the partition was ever applied, so every
		// record fetched so far was given up: start from this poll's first.
		cause := err
		if errors.Is(err, errAbandoned) || errors.Is(err, errYield) {
			cause = nil
		}
		s.release(ctx, f.recs[res.done:], cause)
		res.rewind, res.rewindTo = true, res.stored
		var fe *fenceError
		if errors.As(err, &fe) {
			res.stored, res.rewindTo = fe.stored, fe.stored
		}
		if res.rewindTo < 0 {
			res.rewindTo = f.recs[0].Offset
		}
	}
	if res.advanced || res.rewind {
		s.setStored(p, res.stored, res.epoch, f.topicID)
	}
	return res
}

// release reports recs as released: given up unapplied, nothing of them
// written, to be read again from the stored offset by the partition's next
// owner. The first, the one in flight, is told why (cause; nil when none
// was in flight).
func (s *session) release(ctx context.Context, recs []*kgo.Record, cause error) {
	for i, r := range recs {
		e := s.c.delivery(r)
		e.Type = adapter.EventReleased
		if i == 0 {
			e.Err = cause
		}
		s.c.observe(ctx, e)
	}
}

func waiting(stop, rebal <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	case <-rebal:
		return true
	default:
		return false
	}
}

// records applies recs (of the partition fetch f) one transaction each, in
// order, starting from res.stored, which it advances. It returns nil when
// all are done, a *fenceError, a *stopError, or errAbandoned.
func (s *session) records(ctx context.Context, c *Consumer, res *partResult, recs []*kgo.Record, f *partFetch, h Handler, stop, rebal <-chan struct{}) error {
	for _, r := range recs {
		if waiting(stop, rebal) {
			return errAbandoned
		}
		p := tp{r.Topic, r.Partition}
		for attempt := s.attempts(p, r.Offset) + 1; ; attempt++ {
			e, err := c.recordTx(ctx, r, res.stored, f.topicID, h, attempt)
			if err == nil {
				res.stored, res.advanced, res.epoch = r.Offset+1, true, r.LeaderEpoch
				res.done++
				s.c.observe(ctx, e)
				break
			}
			if errors.Is(err, ErrFenced) {
				e.Type, e.Err = adapter.EventFenced, err
				s.c.observe(ctx, e)
				return err
			}
			if stops(err) {
				return &stopError{err: err, offset: r.Offset, event: e}
			}
			// While the record waits for its next attempt, no group waits
			// for it.
			back := s.c.away()
			err = s.wait(ctx, []adapter.Event{e}, attempt, s.c.requeue(e.Message, err, attempt), stop, rebal)
			back()
			if err != nil {
				return err
			}
			if err := s.yield(p, r.Offset, attempt); err != nil {
				return err
			}
		}
	}
	return nil
}

// wait reports a failed attempt of the records of events as requeued, with
// rq's error and delay, the settle rule's, and sleeps the delay before the
// next attempt, or returns errAbandoned when the shutdown or a rebalance
// is waiting.
func (s *session) wait(ctx context.Context, events []adapter.Event, attempt int, rq *requeueError, stop, rebal <-chan struct{}) error {
	for _, e := range events {
		e.Type, e.Attempt, e.Err, e.Delay = adapter.EventRequeued, attempt, rq.err, rq.delay
		s.c.observe(ctx, e)
	}
	t := time.NewTimer(rq.delay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-stop:
	case <-rebal:
	case <-ctx.Done():
	}
	return errAbandoned
}

// recordTx applies r in one transaction of the Middleware's delivery path:
// the offset advance from expected (storing topicID) and the claim, in one
// statement where the dialect can fold them, then the handler if the claim
// is new. It returns the record's event, its type set when the record was
// settled. What a failure comes to is the settle rule's decision for this
// attempt (attempt, from 1): a poison record is dead-lettered instead, in a
// transaction of its own that advances the offset (the event's Err is then
// why it was poison); a record to requeue is a *requeueError, with the
// rule's delay.
func (c *Consumer) recordTx(ctx context.Context, r *kgo.Record, expected int64, topicID string, h Handler, attempt int) (adapter.Event, error) {
	msg, cause := c.cfg.ac.Message(r)
	e := adapter.Event{Message: msg, Source: position(r), Detail: r, Attempt: attempt}
	tctx, end := c.cfg.ac.StartTrace(ctx, r, msg)
	if cause != nil {
		end(0, cause)
	} else {
		stmt := c.foldStmt(ctx)
		handle := func(ctx context.Context, tx *sql.Tx) error { return h(ctx, tx, r) }
		body := func(ctx context.Context, a *adapter.Attempt) error {
			claimed, err := c.advanceAndClaim(ctx, a, stmt, r, expected, topicID)
			if err != nil || !claimed {
				return err
			}
			return a.Handle(handle)
		}
		var applied bool
		var err error
		if msg.OrderKey != "" {
			var out idempotent.Outcome
			out, err = c.orderedRecord(tctx, r, msg, expected, topicID, handle)
			applied = out != idempotent.Duplicate // a parked record is acknowledged as applied
		} else if c.co != nil {
			// In a coalesced group when other partitions' records are in
			// flight, alone (body) otherwise.
			c.prepareGroup(ctx)
			item := offsetItem{topic: r.Topic, partition: r.Partition, expected: expected, next: r.Offset + 1, topicID: topicID}
			applied, err = c.co.Process(tctx, msg, item, handle, body)
		} else {
			applied, err = c.path.Process(tctx, msg, body)
		}
		if err != nil && stmt != nil {
			err = c.foldError(ctx, err)
		}
		end(outcome(applied), err)
		if err == nil {
			e.Type = adapter.EventDuplicate
			if applied {
				e.Type = adapter.EventApplied
			}
			return e, nil
		}
		if errors.Is(err, ErrFenced) || stops(err) {
			return e, err
		}
		cause = err
	}
	if d := c.rule.Settle(msg, cause, attempt); d.Action != adapter.DeadLetter {
		return e, &requeueError{err: cause, delay: d.Delay}
	}
	err := c.path.Tx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		return c.poisonTx(ctx, tx, r.Topic, r.Partition, expected, r.Offset+1, topicID, []*kgo.Record{r}, []error{cause}, []time.Time{msg.EventTime})
	})
	if err != nil {
		return e, err
	}
	return c.poisoned(e, r, cause), nil
}

// poisoned returns e, the event of the poison record r, as dead-lettered
// for cause: its Detail is r, or a Dropped when there is no dead-letter
// outbox.
func (c *Consumer) poisoned(e adapter.Event, r *kgo.Record, cause error) adapter.Event {
	e.Type, e.Err, e.Detail = adapter.EventDeadLettered, cause, r
	if c.cfg.deadLetter == nil {
		e.Detail = Dropped{Record: r}
	}
	return e
}

// poisonTx advances the offset from expected to next (storing topicID) and
// dead-letters the poison records, each with the event time read from it
// (ats, zero where none).
func (c *Consumer) poisonTx(ctx context.Context, tx *sql.Tx, topic string, partition int32, expected, next int64, topicID string, poison []*kgo.Record, causes []error, ats []time.Time) error {
	if err := c.advanceOffset(ctx, tx, topic, partition, expected, next, topicID); err != nil {
		return err
	}
	if c.cfg.deadLetter == nil {
		return nil
	}
	for i, r := range poison {
		if err := c.deadLetter(ctx, tx, r, causes[i], ats[i]); err != nil {
			return err
		}
	}
	return nil
}

// batches applies the records of f in batches of at most WithBatchSize,
// one transaction and one offset advance each.
func (s *session) batches(ctx context.Context, c *Consumer, res *partResult, f *partFetch, stop, rebal <-chan struct{}) error {
	recs := f.recs
	for len(recs) > 0 {
		chunk := recs[:min(len(recs), s.c.cfg.batchSize)]
		if waiting(stop, rebal) {
			return errAbandoned
		}
		p := tp{chunk[0].Topic, chunk[0].Partition}
		for attempt := s.attempts(p, chunk[0].Offset) + 1; ; attempt++ {
			events, n, err := c.batchTx(ctx, chunk, res.stored, f.topicID, attempt)
			if err == nil {
				last := chunk[n-1]
				res.stored, res.advanced, res.epoch = last.Offset+1, true, last.LeaderEpoch
				res.done += n
				for _, e := range events {
					s.c.observe(ctx, e)
				}
				chunk = chunk[:n]
				break
			}
			if errors.Is(err, ErrFenced) {
				e := s.c.delivery(chunk[0])
				e.Type, e.Err = adapter.EventFenced, err
				s.c.observe(ctx, e)
				return err
			}
			if stops(err) {
				return &stopError{err: err, offset: chunk[0].Offset, event: s.c.delivery(chunk[0])}
			}
			var rq *requeueError
			if errors.As(err, &rq) {
				// The first record waits (dated in the future, within the
				// rule's bound), and the rest behind it.
				if err := s.wait(ctx, []adapter.Event{s.c.delivery(chunk[0])}, attempt, rq, stop, rebal); err != nil {
					return err
				}
				if err := s.yield(p, chunk[0].Offset, attempt); err != nil {
					return err
				}
				continue
			}
			if s.c.rule.Settle(idempotent.Message{}, err, attempt).Action == adapter.DeadLetter {
				// The batch's error names no record it settles (the
				// handler found a poison record among the batch, say):
				// apply the chunk one record at a time, so that only that
				// one is dead-lettered.
				one := func(ctx context.Context, tx *sql.Tx, r *kgo.Record) error {
					return c.batch(ctx, tx, []*kgo.Record{r})
				}
				if err := s.records(ctx, c, res, chunk, f, one, stop, rebal); err != nil {
					return err
				}
				break
			}
			// The batch's transaction failed: every record of it is
			// requeued, and the batch tried again.
			failed := make([]adapter.Event, len(chunk))
			for i, r := range chunk {
				failed[i] = s.c.delivery(r)
			}
			if err := s.wait(ctx, failed, attempt, s.c.requeue(idempotent.Message{}, err, attempt), stop, rebal); err != nil {
				return err
			}
			if err := s.yield(p, chunk[0].Offset, attempt); err != nil {
				return err
			}
		}
		recs = recs[len(chunk):]
	}
	return nil
}

// batchTx applies chunk, whose first record is at or after the stored
// offset expected, in one transaction of the Middleware's delivery path —
// the offset advance (storing topicID) and the dead letters of its poison
// records, then the claims of the others, then the handler for the new
// ones — and returns one event per record, in offset order, and how many
// of chunk's records it applied: all, or those before the first that the
// rule requeues (a record dated in the future, within the rule's bound),
// which waits, with the records behind it, for the next attempt. When the
// first record is to be requeued the error is a *requeueError. attempt
// counts the attempts at chunk's first record, from 1. The Middleware's
// duplicate pre-check is never consulted: a key it remembers may belong to
// a claim a database restore took away, and the batch would then advance
// the offset past a record it never applied.
func (c *Consumer) batchTx(ctx context.Context, chunk []*kgo.Record, expected int64, topicID string, attempt int) ([]adapter.Event, int, error) {
	var good, poison []*kgo.Record
	var msgs, poisonMsgs, chunkMsgs []idempotent.Message
	var causes []error
	for i, r := range chunk {
		msg, err := c.cfg.ac.Message(r)
		if err == nil {
			// The Middleware's own checks, so that one record it would
			// refuse (too old, dated in the future) is settled alone
			// instead of refusing the batch.
			if cerr := c.mw.CheckMessage(msg); cerr != nil {
				err = fmt.Errorf("kafka: %s: %w", position(r), cerr)
			}
		}
		if err != nil {
			n := 1 // a record behind the first is at its first attempt
			if i == 0 {
				n = attempt
			}
			if d := c.rule.Settle(msg, err, n); d.Action != adapter.DeadLetter {
				if i == 0 {
					return nil, 0, &requeueError{err: err, delay: d.Delay}
				}
				chunk = chunk[:i] // the rest waits behind it
				break
			}
			poison, poisonMsgs, causes = append(poison, r), append(poisonMsgs, msg), append(causes, err)
			chunkMsgs = append(chunkMsgs, msg)
			continue
		}
		good, msgs = append(good, r), append(msgs, msg)
		chunkMsgs = append(chunkMsgs, msg)
	}
	// One span for the transaction of the chunk's records, the poison ones
	// (dead-lettered in it) included.
	ctx, end := c.cfg.ac.StartBatchTrace(ctx, chunk, chunkMsgs)
	var results []adapter.Result
	defer func() { end(results) }()
	first, last := chunk[0], chunk[len(chunk)-1]
	next := last.Offset + 1
	companion := func(ctx context.Context, tx *sql.Tx) error {
		return c.poisonTx(ctx, tx, first.Topic, first.Partition, expected, next, topicID, poison, causes, eventTimes(poisonMsgs))
	}
	drop := func(i int, err error) {
		poison, poisonMsgs, causes = append(poison, good[i]), append(poisonMsgs, msgs[i]), append(causes, err)
		good, msgs = slices.Delete(good, i, i+1), slices.Delete(msgs, i, i+1)
	}
	for {
		var applied []bool
		var err error
		if len(good) > 0 && ordered(msgs) {
			var sel []*kgo.Record
			applied, err = c.orderedBatch(ctx, msgs, good, next, companion, &sel)
			if c.dropped(err, msgs, good, sel, drop) {
				continue
			}
		} else if len(good) > 0 {
			var sel []*kgo.Record // the handler's slice, for an *adapter.ItemError
			applied, err = c.path.ProcessBatch(ctx, msgs, func(ctx context.Context, a *adapter.Attempt) error {
				sel = nil
				fresh, err := a.ClaimBatch(func() error { return companion(ctx, a.Tx()) })
				if err != nil || len(fresh) == 0 {
					return err
				}
				sel = make([]*kgo.Record, len(fresh))
				for j, i := range fresh {
					sel[j] = good[i]
				}
				return a.Handle(func(ctx context.Context, tx *sql.Tx) error { return c.batch(ctx, tx, sel) })
			})
			if c.dropped(err, msgs, good, sel, drop) {
				continue
			}
		} else {
			// Every record is poison: the offset advance and the dead
			// letters still commit.
			err = c.path.Tx(ctx, companion)
		}
		if err != nil {
			results = make([]adapter.Result, len(chunk))
			for i := range results {
				results[i].Err = err
			}
			return nil, 0, err
		}
		byRecord := make(map[*kgo.Record]adapter.Event, len(chunk))
		for i, r := range good {
			e := adapter.Event{Type: adapter.EventDuplicate, Message: msgs[i], Source: position(r), Detail: r, Attempt: attempt}
			if applied[i] {
				e.Type = adapter.EventApplied
			}
			byRecord[r] = e
		}
		for i, r := range poison {
			byRecord[r] = c.poisoned(adapter.Event{Message: poisonMsgs[i], Source: position(r), Attempt: attempt}, r, causes[i])
		}
		events := make([]adapter.Event, len(chunk))
		results = make([]adapter.Result, len(chunk))
		for i, r := range chunk {
			events[i] = byRecord[r]
			results[i] = eventResult(events[i])
		}
		return events, len(chunk), nil
	}
}

// dropped reports whether err, a batch's failure, names one of its records
// that the settle rule makes poison, and if so drops it (drop, with its
// index in good): a key the batch cannot claim (the same key on two event
// days, in partitioned mode; a sequence an operator skipped), by an
// *idempotent.BatchKeyError's index in msgs, or a record the handler
// named, by an *adapter.ItemError's index in sel, the handler's records.
// The batch then runs again without it.
func (c *Consumer) dropped(err error, msgs []idempotent.Message, good, sel []*kgo.Record, drop func(int, error)) bool {
	var bke *idempotent.BatchKeyError
	if errors.As(err, &bke) && c.rule.Settle(msgs[bke.Index], bke.Err, 1).Action == adapter.DeadLetter {
		drop(bke.Index, bke.Err)
		return true
	}
	var ie *adapter.ItemError
	if errors.As(err, &ie) && ie.Index >= 0 && ie.Index < len(sel) {
		if i := slices.Index(good, sel[ie.Index]); i >= 0 && c.rule.Settle(msgs[i], err, 1).Action == adapter.DeadLetter {
			drop(i, err)
			return true
		}
	}
	return false
}

// ordered reports whether one of msgs carries an ordering key: the batch
// then runs on the Middleware's ordered step (orderedBatch).
func ordered(msgs []idempotent.Message) bool {
	for _, m := range msgs {
		if m.OrderKey != "" {
			return true
		}
	}
	return false
}

func eventTimes(msgs []idempotent.Message) []time.Time {
	ats := make([]time.Time, len(msgs))
	for i, m := range msgs {
		ats[i] = m.EventTime
	}
	return ats
}
