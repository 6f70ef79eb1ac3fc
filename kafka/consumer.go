package kafka

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/internal/claimfold"
)

// Consumer consumes topics as a member of a Kafka consumer group and applies
// each record's effect exactly once, advancing the partition's offset in the
// database in the same transaction (see the package documentation). It is
// safe for concurrent use; Run may be called several times at once, each
// call one group member.
type Consumer struct {
	db       *sql.DB
	mw       *idempotent.Middleware
	consumer string
	key      KeyFunc
	handle   Handler
	batch    BatchHandler
	cfg      config
	q        offsetStatements
	stats    counters

	fold *claimfold.Fold // the claim folded with the offset advance; nil: cannot

	prepMu   sync.Mutex
	prepared *sql.Stmt // the offset advance, prepared on first use
	folded   *sql.Stmt // the fold, prepared on first use
}

type counters struct {
	applied, duplicates, deadLettered, dropped, retries, fenced, rebalances atomic.Int64
}

// NewConsumer returns a Consumer that applies each record with h, one
// transaction per record. key reads each record's message key; nil means
// Header(DefaultKeyHeader). db is the database of mw's claim table, where
// the offsets table must be too. The offsets rows are keyed by mw's consumer
// name: give each consumer group its own. NewConsumer sends nothing to the
// database or to Kafka; Run does. Only Postgres is supported.
func NewConsumer(db *sql.DB, mw *idempotent.Middleware, key KeyFunc, h Handler, opts ...Option) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("kafka: NewConsumer: nil handler")
	}
	return newConsumer("NewConsumer", db, mw, key, h, nil, opts)
}

// NewBatchConsumer returns a Consumer that applies the records of each poll
// for each partition together: one transaction claims them all (with
// Middleware.ProcessMessages, each record with its timestamp as its event
// time unless WithoutEventTime, so a partitioned claim table works too),
// runs h once for the new ones, and advances the partition's offset once,
// past the last. It is the throughput path; see NewConsumer for the other
// arguments.
func NewBatchConsumer(db *sql.DB, mw *idempotent.Middleware, key KeyFunc, h BatchHandler, opts ...Option) (*Consumer, error) {
	if h == nil {
		return nil, errors.New("kafka: NewBatchConsumer: nil handler")
	}
	return newConsumer("NewBatchConsumer", db, mw, key, nil, h, opts)
}

func newConsumer(fn string, db *sql.DB, mw *idempotent.Middleware, key KeyFunc, h Handler, bh BatchHandler, opts []Option) (*Consumer, error) {
	if db == nil {
		return nil, fmt.Errorf("kafka: %s: nil *sql.DB", fn)
	}
	if mw == nil {
		return nil, fmt.Errorf("kafka: %s: nil middleware", fn)
	}
	if name := mw.Dialect().Name(); name != "postgres" {
		return nil, fmt.Errorf("kafka: %s: the %s dialect is not supported: the offsets table is Postgres only", fn, name)
	}
	if key == nil {
		key = Header(DefaultKeyHeader)
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("kafka: %s: nil option", fn)
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.noEventTime && mw.Partitioned() {
		return nil, fmt.Errorf("kafka: %s: WithoutEventTime, but the claim table %s is partitioned by event day: every record needs its event time there", fn, mw.Table())
	}
	q, err := newOffsetStatements(cfg.offsetsTable)
	if err != nil {
		return nil, err
	}
	return &Consumer{db: db, mw: mw, consumer: mw.Consumer(), key: key, handle: h, batch: bh, cfg: cfg, q: q, fold: newFold(mw, q)}, nil
}

// Stats returns the counts so far.
func (c *Consumer) Stats() Stats {
	s := &c.stats
	return Stats{
		Applied: s.applied.Load(), Duplicates: s.duplicates.Load(), DeadLettered: s.deadLettered.Load(),
		Dropped: s.dropped.Load(), Retries: s.retries.Load(), Fenced: s.fenced.Load(), Rebalances: s.rebalances.Load(),
	}
}

// Run joins the consumer group configured in clientOpts (kgo.ConsumerGroup
// and kgo.ConsumeTopics are required, with the seed brokers) and consumes
// until ctx ends or the client fails.
//
// Run adds its own options after clientOpts, which replace the same options
// given there: kgo.BlockRebalanceOnPoll, kgo.DisableAutoCommit,
// kgo.AdjustFetchOffsetsFn (to seek each assigned partition to the offset
// stored in the database), kgo.OnPartitionsRevoked, kgo.OnPartitionsLost and
// kgo.OnPartitionsCallbackBlocked. Any balancer works.
//
// Each poll's records are split by partition; partitions are processed
// concurrently by up to WithWorkers goroutines, the records of one partition
// in offset order. The group cannot rebalance until the poll's work is done:
// when a rebalance is waiting, records not yet started are abandoned (and
// read again, by whichever member owns the partition next, from the stored
// offset) while transactions in flight finish. After the database commits,
// the offsets are also committed to Kafka, asynchronously, for lag tools
// only.
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
	s := &session{c: c, owned: map[tp]int64{}}
	s.rebal = make(chan struct{})
	opts := append(slices.Clip(clientOpts),
		kgo.BlockRebalanceOnPoll(),
		kgo.DisableAutoCommit(),
		kgo.AdjustFetchOffsetsFn(s.adjust),
		kgo.OnPartitionsRevoked(func(ctx context.Context, _ *kgo.Client, m map[string][]int32) { s.drop(ctx, EventRevoked, m) }),
		kgo.OnPartitionsLost(func(ctx context.Context, _ *kgo.Client, m map[string][]int32) { s.drop(ctx, EventLost, m) }),
		kgo.OnPartitionsCallbackBlocked(func(context.Context, *kgo.Client) { s.rebalanceWaiting() }),
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
			t := time.AfterFunc(c.cfg.shutdownTimeout, hcancel)
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
		if fetches.IsClientClosed() {
			runErr = fmt.Errorf("%w: closed while consuming", ErrClient)
			break
		}
		if err := s.fetchErrors(ctx, fetches); err != nil {
			runErr = err
			break
		}
		rewind, commit := s.round(hctx, fetches, stop)
		if len(rewind) > 0 {
			cl.SetOffsets(rewind)
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
		cctx, cancel := context.WithTimeout(hctx, c.cfg.shutdownTimeout)
		cl.CommitOffsetsSync(cctx, final, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			s.commitDone(hctx, resp, err)
		})
		cancel()
	}
	cl.CloseAllowingRebalance()
	return runErr
}

// fetchErrors reports the fetch errors of a poll to the observer, and
// returns the first one retrying cannot fix.
func (s *session) fetchErrors(ctx context.Context, fetches kgo.Fetches) error {
	for _, fe := range fetches.Errors() {
		if errors.Is(fe.Err, context.Canceled) || errors.Is(fe.Err, context.DeadlineExceeded) {
			continue
		}
		if errors.Is(fe.Err, kgo.ErrClientClosed) {
			return fmt.Errorf("%w: %w", ErrClient, fe.Err)
		}
		var ke *kerr.Error
		var gs *kgo.ErrGroupSession
		if errors.As(fe.Err, &ke) && !ke.Retriable && !errors.As(fe.Err, &gs) {
			return fmt.Errorf("%w: topic %q partition %d: %w", ErrClient, fe.Topic, fe.Partition, fe.Err)
		}
		s.c.observe(ctx, Event{Type: EventFetchError, Topic: fe.Topic, Partition: fe.Partition, Err: fe.Err})
	}
	return nil
}

func (c *Consumer) observe(ctx context.Context, e Event) {
	switch e.Type {
	case EventApplied:
		c.stats.applied.Add(1)
	case EventDuplicate:
		c.stats.duplicates.Add(1)
	case EventDeadLettered:
		c.stats.deadLettered.Add(1)
	case EventDropped:
		c.stats.dropped.Add(1)
	case EventRetry:
		c.stats.retries.Add(1)
	case EventFenced:
		c.stats.fenced.Add(1)
	case EventAssigned:
		c.stats.rebalances.Add(1)
	}
	if c.cfg.observer != nil {
		c.cfg.observer.Observe(ctx, e)
	}
}

func (c *Consumer) isPoison(err error) bool {
	if errors.Is(err, ErrFenced) {
		return false
	}
	if IsPoison(err) {
		return true
	}
	for _, p := range c.cfg.poison {
		if p(err) {
			return true
		}
	}
	return false
}

// runTx runs fn in a transaction with the Consumer's retry policy.
func (c *Consumer) runTx(ctx context.Context, fn idempotent.TxFunc) error {
	return idempotent.RunTx(ctx, c.db, c.mw.Dialect(), c.cfg.txOpts, c.cfg.retry, fn)
}

// recordKey returns r's message key, or a poison error.
func (c *Consumer) recordKey(r *kgo.Record) (string, error) {
	k, err := c.key(r)
	if err != nil {
		if errors.Is(err, idempotent.ErrInvalidKey) || errors.Is(err, ErrPoison) {
			return "", err
		}
		return "", fmt.Errorf("%w: key function: %w", idempotent.ErrInvalidKey, err)
	}
	return k, nil
}

// claim claims key in tx, with r's timestamp as the event time unless
// WithoutEventTime.
func (c *Consumer) claim(ctx context.Context, tx *sql.Tx, key string, r *kgo.Record) (bool, error) {
	return c.mw.ClaimMessage(ctx, tx, c.message(key, r))
}

// message returns r's message: its key and, unless WithoutEventTime, its
// timestamp as its event time.
func (c *Consumer) message(key string, r *kgo.Record) idempotent.Message {
	if c.cfg.noEventTime {
		return idempotent.Message{Key: key}
	}
	return idempotent.Message{Key: key, EventTime: r.Timestamp}
}

// backoff is the wait after the given failed attempt (1-based).
func (c *Consumer) backoff(attempt int) time.Duration {
	d := c.cfg.retryInitial
	for i := 1; i < attempt && d < c.cfg.retryMax; i++ {
		d *= 2
	}
	return min(d, c.cfg.retryMax)
}

// tp names a partition.
type tp struct {
	topic     string
	partition int32
}

// session is one Run: the partitions this member owns and their stored
// offsets as it last read or wrote them.
type session struct {
	c     *Consumer
	mu    sync.Mutex
	owned map[tp]int64  // stored next offset, -1 when none is stored
	epoch map[tp]int32  // leader epoch of the last record applied
	rebal chan struct{} // closed when a rebalance waits for this poll's work
}

// adjust is the AdjustFetchOffsetsFn: it replaces the offsets the client
// would start from with the ones stored in the database, where there are.
func (s *session) adjust(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	stored := map[string]map[int32]int64{}
	parts := map[string][]int32{}
	for topic, ps := range offsets {
		have, err := s.c.loadOffsets(ctx, topic)
		if err != nil {
			return nil, err
		}
		stored[topic] = map[int32]int64{}
		for p := range ps {
			parts[topic] = append(parts[topic], p)
			o, ok := have[p]
			if !ok {
				stored[topic][p] = -1
				continue
			}
			stored[topic][p] = o
			ps[p] = kgo.NewOffset().At(o).WithEpoch(-1)
		}
		slices.Sort(parts[topic])
	}
	s.mu.Lock()
	for topic, ps := range stored {
		for p, o := range ps {
			s.owned[tp{topic, p}] = o
		}
	}
	s.mu.Unlock()
	s.c.observe(ctx, Event{Type: EventAssigned, Partitions: parts, Offsets: stored})
	return offsets, nil
}

// drop forgets revoked or lost partitions.
func (s *session) drop(ctx context.Context, typ EventType, m map[string][]int32) {
	if len(m) == 0 {
		return
	}
	s.mu.Lock()
	for topic, ps := range m {
		for _, p := range ps {
			delete(s.owned, tp{topic, p})
			delete(s.epoch, tp{topic, p})
		}
	}
	s.mu.Unlock()
	s.c.observe(ctx, Event{Type: typ, Partitions: m})
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

func (s *session) stored(p tp) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.owned[p]
	return o, ok
}

func (s *session) setStored(p tp, o int64, epoch int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.owned[p]; ok {
		s.owned[p] = o
		if s.epoch == nil {
			s.epoch = map[tp]int32{}
		}
		s.epoch[p] = epoch
	}
}

// lastCommits returns the stored offsets of the owned partitions that have
// one, for the final commit to Kafka.
func (s *session) lastCommits() map[string]map[int32]kgo.EpochOffset {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]map[int32]kgo.EpochOffset{}
	for p, o := range s.owned {
		if o < 0 {
			continue
		}
		if out[p.topic] == nil {
			out[p.topic] = map[int32]kgo.EpochOffset{}
		}
		e, ok := s.epoch[p]
		if !ok {
			e = -1
		}
		out[p.topic][p.partition] = kgo.EpochOffset{Epoch: e, Offset: o}
	}
	return out
}

func (s *session) commitDone(ctx context.Context, resp *kmsg.OffsetCommitResponse, err error) {
	if err != nil {
		s.c.observe(ctx, Event{Type: EventCommitFailed, Err: err})
		return
	}
	if resp == nil {
		return
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				s.c.observe(ctx, Event{Type: EventCommitFailed, Topic: t.Topic, Partition: p.Partition, Err: err})
			}
		}
	}
}

// partResult is what one partition's work in a poll came to.
type partResult struct {
	p        tp
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
	recs := map[tp][]*kgo.Record{}
	hw := map[tp]int64{}
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		k := tp{p.Topic, p.Partition}
		if _, ok := recs[k]; !ok {
			order = append(order, k)
		}
		recs[k] = append(recs[k], p.Records...)
		hw[k] = p.HighWatermark
	})
	results := make([]partResult, len(order))
	sem := make(chan struct{}, s.c.cfg.workers)
	var wg sync.WaitGroup
	for i, p := range order {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			results[i] = s.partition(ctx, p, recs[p], hw[p], stop, rebal)
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

var errAbandoned = errors.New("kafka: abandoned")

// partition applies one partition's records of a poll.
func (s *session) partition(ctx context.Context, p tp, recs []*kgo.Record, hw int64, stop, rebal <-chan struct{}) partResult {
	stored, ok := s.stored(p)
	res := partResult{p: p, stored: stored, epoch: -1}
	if !ok {
		return res
	}
	var err error
	if s.c.batch != nil {
		err = s.batches(ctx, &res, recs, hw, stop, rebal)
	} else {
		err = s.records(ctx, &res, recs, hw, s.c.handle, stop, rebal)
	}
	if err != nil {
		// Fetch the partition again from the stored offset: the client's
		// position is past records that were not applied. With no stored
		// offset, nothing of the partition was ever applied, so every
		// record fetched so far was given up: start from this poll's first.
		res.rewind, res.rewindTo = true, res.stored
		var fe *fenceError
		if errors.As(err, &fe) {
			res.stored, res.rewindTo = fe.stored, fe.stored
		}
		if res.rewindTo < 0 {
			res.rewindTo = recs[0].Offset
		}
	}
	if res.advanced || res.rewind {
		s.setStored(p, res.stored, res.epoch)
	}
	return res
}

func lag(hw int64, r *kgo.Record) int64 {
	if hw < 0 {
		return -1
	}
	return max(hw-r.Offset-1, 0)
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

// records applies recs one transaction each, in order, starting from
// res.stored, which it advances. It returns nil when all are done, a
// *fenceError, or errAbandoned.
func (s *session) records(ctx context.Context, res *partResult, recs []*kgo.Record, hw int64, h Handler, stop, rebal <-chan struct{}) error {
	for _, r := range recs {
		if r.Offset < res.stored {
			continue
		}
		if waiting(stop, rebal) {
			s.c.observe(ctx, Event{Type: EventAbandoned, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset})
			return errAbandoned
		}
		for attempt := 1; ; attempt++ {
			typ, key, cause, err := s.c.recordTx(ctx, r, res.stored, h)
			if err == nil {
				res.stored, res.advanced, res.epoch = r.Offset+1, true, r.LeaderEpoch
				s.c.observe(ctx, Event{Type: typ, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: key, Lag: lag(hw, r), Err: cause})
				break
			}
			if errors.Is(err, ErrFenced) {
				s.c.observe(ctx, Event{Type: EventFenced, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: key, Err: err})
				return err
			}
			if err := s.wait(ctx, Event{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: key}, attempt, err, stop, rebal); err != nil {
				return err
			}
		}
	}
	return nil
}

// wait reports a failed attempt and sleeps before the next, or returns
// errAbandoned when the shutdown or a rebalance is waiting.
func (s *session) wait(ctx context.Context, e Event, attempt int, err error, stop, rebal <-chan struct{}) error {
	e.Type, e.Attempt, e.Err, e.Delay = EventRetry, attempt, err, s.c.backoff(attempt)
	s.c.observe(ctx, e)
	t := time.NewTimer(e.Delay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-stop:
	case <-rebal:
	case <-ctx.Done():
	}
	e.Type, e.Err = EventAbandoned, nil
	s.c.observe(ctx, e)
	return errAbandoned
}

// recordTx applies r in one transaction: the offset advance from expected
// and the claim (one statement where the dialect can fold them), the
// handler if the claim is new. A poison record is dead-lettered instead, in
// a transaction of its own that advances the offset; cause is then why it
// was poison.
func (c *Consumer) recordTx(ctx context.Context, r *kgo.Record, expected int64, h Handler) (typ EventType, key string, cause, err error) {
	key, cause = c.recordKey(r)
	if cause == nil {
		stmt := c.foldStmt(ctx)
		err = c.runTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			claimed, err := c.advanceAndClaim(ctx, tx, stmt, key, r, expected)
			if err != nil {
				return err
			}
			if !claimed {
				typ = EventDuplicate
				return nil
			}
			typ = EventApplied
			return h(ctx, tx, r)
		})
		if err != nil && stmt != nil {
			err = c.foldError(ctx, err)
		}
		if err == nil || !c.isPoison(err) {
			return typ, key, nil, err
		}
		cause = err
	}
	err = c.runTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		return c.poisonTx(ctx, tx, r.Topic, r.Partition, expected, r.Offset+1, []*kgo.Record{r}, []error{cause})
	})
	if err != nil {
		return 0, key, nil, err
	}
	return c.poisonType(), key, cause, nil
}

func (c *Consumer) poisonType() EventType {
	if c.cfg.deadLetter == nil {
		return EventDropped
	}
	return EventDeadLettered
}

// poisonTx advances the offset from expected to next and dead-letters the
// poison records.
func (c *Consumer) poisonTx(ctx context.Context, tx *sql.Tx, topic string, partition int32, expected, next int64, poison []*kgo.Record, causes []error) error {
	if err := c.advanceOffset(ctx, tx, topic, partition, expected, next); err != nil {
		return err
	}
	if c.cfg.deadLetter == nil {
		return nil
	}
	for i, r := range poison {
		if err := c.deadLetter(ctx, tx, r, causes[i]); err != nil {
			return err
		}
	}
	return nil
}

// batches applies recs in batches of at most idempotent.MaxBatchSize, one
// transaction and one offset advance each.
func (s *session) batches(ctx context.Context, res *partResult, recs []*kgo.Record, hw int64, stop, rebal <-chan struct{}) error {
	i := 0
	for i < len(recs) && recs[i].Offset < res.stored {
		i++
	}
	recs = recs[i:]
	for len(recs) > 0 {
		chunk := recs[:min(len(recs), idempotent.MaxBatchSize)]
		recs = recs[len(chunk):]
		if waiting(stop, rebal) {
			s.c.observe(ctx, Event{Type: EventAbandoned, Topic: chunk[0].Topic, Partition: chunk[0].Partition, Offset: chunk[0].Offset})
			return errAbandoned
		}
		for attempt := 1; ; attempt++ {
			events, err := s.c.batchTx(ctx, chunk, res.stored)
			if err == nil {
				last := chunk[len(chunk)-1]
				res.stored, res.advanced, res.epoch = last.Offset+1, true, last.LeaderEpoch
				for _, e := range events {
					e.Lag = lag(hw, chunk[len(chunk)-1]) + (last.Offset - e.Offset)
					s.c.observe(ctx, e)
				}
				break
			}
			if errors.Is(err, ErrFenced) {
				s.c.observe(ctx, Event{Type: EventFenced, Topic: chunk[0].Topic, Partition: chunk[0].Partition, Offset: chunk[0].Offset, Err: err})
				return err
			}
			if s.c.isPoison(err) {
				// The handler found a poison record among the batch:
				// apply the chunk one record at a time, so that only that
				// one is dead-lettered.
				one := func(ctx context.Context, tx *sql.Tx, r *kgo.Record) error {
					return s.c.batch(ctx, tx, []*kgo.Record{r})
				}
				if err := s.records(ctx, res, chunk, hw, one, stop, rebal); err != nil {
					return err
				}
				break
			}
			if err := s.wait(ctx, Event{Topic: chunk[0].Topic, Partition: chunk[0].Partition, Offset: chunk[0].Offset}, attempt, err, stop, rebal); err != nil {
				return err
			}
		}
	}
	return nil
}

// batchTx applies chunk, whose first record is at or after the stored
// offset expected, in one transaction, and returns one event per record.
func (c *Consumer) batchTx(ctx context.Context, chunk []*kgo.Record, expected int64) ([]Event, error) {
	first, last := chunk[0], chunk[len(chunk)-1]
	next := last.Offset + 1
	var good, poison []*kgo.Record
	var msgs []idempotent.Message
	var causes []error
	for _, r := range chunk {
		k, err := c.recordKey(r)
		var msg idempotent.Message
		if err == nil {
			// The Middleware's own checks, so that one record it would
			// refuse (too old, dated in the future) is dead-lettered alone
			// instead of refusing the batch.
			msg = c.message(k, r)
			if cerr := c.mw.CheckMessage(msg); cerr != nil {
				err = fmt.Errorf("kafka: %s: %w", deadLetterKey(r), cerr)
			}
		}
		if err != nil {
			poison, causes = append(poison, r), append(causes, err)
			continue
		}
		good, msgs = append(good, r), append(msgs, msg)
	}
	for {
		ran := false
		var outcomes []idempotent.Outcome
		var err error
		if len(good) > 0 {
			outcomes, err = c.mw.ProcessMessages(ctx, msgs, func(ctx context.Context, tx *sql.Tx, fresh []int) error {
				ran = true
				if err := c.poisonTx(ctx, tx, first.Topic, first.Partition, expected, next, poison, causes); err != nil {
					return err
				}
				sel := make([]*kgo.Record, len(fresh))
				for j, i := range fresh {
					sel[j] = good[i]
				}
				return c.batch(ctx, tx, sel)
			})
			var bke *idempotent.BatchKeyError
			if errors.As(err, &bke) {
				// An invalid key (too long, say): that record is poison.
				poison, causes = append(poison, good[bke.Index]), append(causes, bke.Err)
				good, msgs = slices.Delete(good, bke.Index, bke.Index+1), slices.Delete(msgs, bke.Index, bke.Index+1)
				continue
			}
			var re *RecordError
			if errors.As(err, &re) && c.isPoison(err) {
				if i := slices.Index(good, re.Record); i >= 0 {
					poison, causes = append(poison, good[i]), append(causes, err)
					good, msgs = slices.Delete(good, i, i+1), slices.Delete(msgs, i, i+1)
					continue
				}
			}
			if err != nil {
				return nil, err
			}
		}
		if !ran {
			// Every claim existed (or there were none): the offset advance
			// and the dead letters still commit.
			err = c.runTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				return c.poisonTx(ctx, tx, first.Topic, first.Partition, expected, next, poison, causes)
			})
			if err != nil {
				return nil, err
			}
		}
		events := make([]Event, 0, len(chunk))
		for i, r := range good {
			typ := EventDuplicate
			if outcomes[i] == idempotent.Applied {
				typ = EventApplied
			}
			events = append(events, Event{Type: typ, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: msgs[i].Key})
		}
		for i, r := range poison {
			events = append(events, Event{Type: c.poisonType(), Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Err: causes[i]})
		}
		slices.SortFunc(events, func(a, b Event) int { return cmp.Compare(a.Offset, b.Offset) })
		return events, nil
	}
}
