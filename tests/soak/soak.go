package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lib/pq"

	"github.com/txclaim/idempotent/tests/internal/pgcluster"
)

// soakConfig configures one run.
type soakConfig struct {
	Duration     time.Duration // production and faults; drain and audit follow
	Seed         uint64
	Consumers    int     // consumer processes per lane
	Workers      int     // concurrent deliveries per process
	Coalesce     int     // WithCoalescing's Max for each consumer; 0 for none
	DupShare     float64 // share of deliveries that duplicate an earlier order
	Rate         int     // new orders per second per lane
	Customers    int
	FaultEvery   time.Duration // mean time between extra faults
	Lease        time.Duration // how long a leased delivery is hidden from other consumers
	DrainTimeout time.Duration
	Progress     time.Duration // between progress lines; 0 prints none
	Keep         bool
}

func defaultSoakConfig() soakConfig {
	return soakConfig{
		Duration: 60 * time.Second, Consumers: 2, Workers: 3, DupShare: 0.3, Rate: 120,
		Customers: 25, FaultEvery: time.Second, Lease: 2 * time.Second, DrainTimeout: 90 * time.Second,
		Progress: 5 * time.Second,
	}
}

func (c soakConfig) validate() error {
	switch {
	case c.Duration <= 0:
		return errors.New("-duration must be positive")
	case c.Consumers < 1 || c.Workers < 1:
		return errors.New("-consumers and -workers must be at least 1")
	case c.Coalesce == 1 || c.Coalesce < 0:
		return fmt.Errorf("-coalesce %d: want 0 (none) or at least 2", c.Coalesce)
	case c.DupShare < 0 || c.DupShare > 0.9:
		return fmt.Errorf("-dup %v is outside 0 to 0.9", c.DupShare)
	case c.Rate < 1 || c.Customers < 1:
		return errors.New("-rate and -customers must be at least 1")
	case c.FaultEvery <= 0:
		return errors.New("-fault-every must be positive")
	case c.Progress < 0:
		return errors.New("-progress must not be negative")
	}
	return nil
}

// The fault types. Every one must be injected at least once in every lane
// (the restart hits both lanes at once) or the run fails.
const (
	faultKillHandler = "backend-kill-mid-handler"
	faultKillCommit  = "backend-kill-mid-commit"
	faultAckLost     = "commit-ack-lost"
	faultSigkill     = "consumer-sigkill"
	faultRestart     = "postgres-restart"
	faultFailover    = "primary-failover"
)

var faultKinds = []string{faultKillHandler, faultKillCommit, faultAckLost, faultSigkill, faultRestart, faultFailover}

// globalFault reports whether a fault kind hits the whole server (both
// lanes at once) rather than one lane.
func globalFault(kind string) bool { return kind == faultRestart || kind == faultFailover }

// fault is one scheduled fault.
type fault struct {
	at   time.Duration
	kind string
	lane string // "" for the restart
}

// schedule draws the fault schedule from rng: every kind once per lane at a
// random moment, the restart once between 30% and 60% of the run, and
// extra faults at exponentially distributed intervals.
func schedule(rng *rand.Rand, cfg soakConfig) []fault {
	d := float64(cfg.Duration)
	at := func(lo, hi float64) time.Duration { return time.Duration(d * (lo + (hi-lo)*rng.Float64())) }
	var fs []fault
	for _, l := range lanes {
		for _, k := range []string{faultKillHandler, faultKillCommit, faultAckLost, faultSigkill} {
			fs = append(fs, fault{at: at(0.1, 0.85), kind: k, lane: l.name})
		}
	}
	fs = append(fs, fault{at: at(0.3, 0.6), kind: faultRestart})
	fs = append(fs, fault{at: at(0.65, 0.85), kind: faultFailover})
	for t := time.Duration(0); ; {
		t += time.Duration(rng.ExpFloat64() * float64(cfg.FaultEvery))
		if t >= time.Duration(d*0.9) {
			break
		}
		var k string
		switch p := rng.Float64(); {
		case p < 0.3:
			k = faultKillHandler
		case p < 0.6:
			k = faultKillCommit
		case p < 0.8:
			k = faultAckLost
		default:
			k = faultSigkill
		}
		fs = append(fs, fault{at: t, kind: k, lane: lanes[rng.IntN(len(lanes))].name})
	}
	sort.SliceStable(fs, func(i, j int) bool { return fs[i].at < fs[j].at })
	return fs
}

// order is one distinct OrderCompleted effect.
type order struct {
	id, customer, points      int64
	handlerDelay, commitDelay int32
}

// laneStats is what the producer published in one lane.
type laneStats struct {
	orders, deliveries, dupConcurrent, dupReplay atomic.Int64
}

// proc is one incarnation of a consumer process.
type proc struct {
	lane     string
	slot     int
	instance string
	cmd      *exec.Cmd
	done     chan struct{}
	killed   atomic.Bool // SIGKILLed by the injector
	stopping atomic.Bool // asked to stop at the end
	err      error       // exit status, set before done closes
}

// soak is one run: the cluster, the consumer processes, the producer, the
// injector and what they counted.
type soak struct {
	cfg      soakConfig
	out      io.Writer
	cl       *pgcluster.Cluster // the primary (the promoted standby after the failover)
	standby  *pgcluster.Cluster // the synchronous standby (nil after the failover)
	dsnHosts string             // "host=… port=…" of both, for target_session_attrs=read-write
	settings []string           // the primary's settings, kept across its restart
	admin    *sql.DB            // producer and setup
	inj      *sql.DB            // fault injector
	exe      string
	conslog  *os.File
	proxies  map[string]*ackProxy // lane → its consumers' proxy

	mu         sync.Mutex
	procs      map[string]*proc  // lane/slot → running incarnation
	incarn     map[string]int    // lane/slot → incarnations so far
	reports    map[string]report // instance → last report
	faults     map[string]map[string]int
	missed     map[string]int
	unexpected []string
	stats      map[string]*laneStats
	restart    time.Duration // how long the server was down
	failover   time.Duration // from the primary's SIGKILL to the standby's promotion
	audits     []laneAudit
}

// result is the outcome of the audit: a list of problems, empty when the
// run passed.
type result struct {
	problems []string
}

func (r *result) ok() bool { return len(r.problems) == 0 }

func (r *result) failf(format string, args ...any) {
	r.problems = append(r.problems, fmt.Sprintf(format, args...))
}

// runSoak runs the whole soak and prints its report to out. An error means
// the harness itself could not run; audit failures are in the result.
func runSoak(ctx context.Context, cfg soakConfig, out io.Writer) (*result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	bin, err := pgcluster.FindBin()
	if err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "soak: seed=%d duration=%v lanes=read_committed,serializable consumers=%d×%d workers per lane coalesce=%d dup=%.2f rate=%d/s per lane customers=%d\n",
		cfg.Seed, cfg.Duration, cfg.Consumers, cfg.Workers, cfg.Coalesce, cfg.DupShare, cfg.Rate, cfg.Customers)
	cl, err := pgcluster.New(ctx, bin, pgcluster.Options{Prefix: "idempotent-soak-"})
	if err != nil {
		return nil, err
	}
	s := &soak{
		cfg: cfg, out: out, cl: cl, exe: exe,
		procs: map[string]*proc{}, incarn: map[string]int{}, reports: map[string]report{},
		faults: map[string]map[string]int{}, missed: map[string]int{}, stats: map[string]*laneStats{},
		proxies: map[string]*ackProxy{},
	}
	defer func() {
		if cfg.Keep {
			_ = cl.Stop()
			fmt.Fprintf(out, "soak: kept the cluster's directory %s\n", cl.Dir)
			return
		}
		cl.Remove()
	}()
	s.settings = []string{"synchronous_standby_names=soak_standby", "synchronous_commit=on"}
	if err := cl.Start(ctx, s.settings...); err != nil {
		return nil, err
	}
	sb, err := pgcluster.NewStandby(ctx, cl, pgcluster.Options{Prefix: "idempotent-soak-standby-"}, "soak_standby", "")
	if err != nil {
		return nil, err
	}
	defer func() {
		if cfg.Keep {
			_ = sb.Stop()
			fmt.Fprintf(out, "soak: kept the standby's directory %s\n", sb.Dir)
			return
		}
		sb.Remove()
	}()
	if err := sb.Start(ctx); err != nil {
		return nil, err
	}
	s.standby = sb
	s.dsnHosts = fmt.Sprintf("host=%s,%s port=%d,%d", cl.Dir, sb.Dir, cl.Port, sb.Port)
	fmt.Fprintf(out, "soak: throwaway cluster %s (PostgreSQL from %s, socket port %d) with a synchronous standby %s\n", cl.Dir, bin, cl.Port, sb.Dir)
	if s.conslog, err = os.Create(filepath.Join(cl.Dir, "consumers.log")); err != nil {
		return nil, err
	}
	defer s.conslog.Close()
	return s.run(ctx)
}

func (s *soak) run(ctx context.Context) (*result, error) {
	var err error
	if err := s.waitSyncStandby(ctx); err != nil {
		return nil, err
	}
	if s.admin, err = sql.Open("postgres", s.rwDSN("soak-admin")); err != nil {
		return nil, err
	}
	s.admin.SetMaxOpenConns(4)
	defer func() { _ = s.admin.Close() }()
	if s.inj, err = sql.Open("postgres", s.rwDSN("soak-injector")); err != nil {
		return nil, err
	}
	s.inj.SetMaxOpenConns(2)
	defer func() { _ = s.inj.Close() }()

	for _, l := range lanes {
		if err := l.setup(ctx, s.admin, s.cfg.Customers); err != nil {
			return nil, err
		}
		s.stats[l.name] = &laneStats{}
		p, err := startAckProxy(filepath.Join(s.cl.Dir, "proxy-"+l.name), s.cl)
		if err != nil {
			return nil, err
		}
		s.proxies[l.name] = p
		defer p.close()
	}
	defer s.killAll()
	for _, l := range lanes {
		for slot := 1; slot <= s.cfg.Consumers; slot++ {
			if err := s.spawn(l.name, slot); err != nil {
				return nil, err
			}
		}
	}

	// Production and faults for cfg.Duration.
	start := time.Now()
	stopProduce := make(chan struct{})
	var producers sync.WaitGroup
	for i, l := range lanes {
		rng := newRand(s.cfg.Seed, uint64(i+1))
		producers.Add(1)
		go func() {
			defer producers.Done()
			s.produce(ctx, l, rng, stopProduce)
		}()
	}
	stopProgress := make(chan struct{})
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		s.reportProgress(start, stopProgress)
	}()
	sched := schedule(newRand(s.cfg.Seed, 0), s.cfg)
	injErr := s.inject(ctx, start, sched)
	if wait := s.cfg.Duration - time.Since(start); wait > 0 && injErr == nil {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
	}
	close(stopProduce)
	producers.Wait()
	close(stopProgress)
	<-progressDone
	if injErr != nil {
		return nil, injErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	// Drain: the consumers keep going, without faults, until every
	// delivery has been acked.
	res := &result{}
	drainStart := time.Now()
	if left, err := s.drain(ctx); err != nil {
		res.failf("drain: %v", err)
	} else if left > 0 {
		res.failf("drain: %d deliveries still in the inbox after %v", left, s.cfg.DrainTimeout)
	}
	drained := time.Since(drainStart)
	s.stopConsumers(res)
	_ = s.inj.Close()
	_ = s.admin.Close()

	audit, err := sql.Open("postgres", s.cl.DSN("soak-audit"))
	if err != nil {
		return nil, err
	}
	defer audit.Close()
	audit.SetMaxOpenConns(1)
	s.checkBackends(ctx, audit, res)
	for _, l := range lanes {
		s.audits = append(s.audits, s.auditLane(ctx, audit, l, res))
	}
	s.print(res, time.Since(start)-drained, drained)
	return res, nil
}

// spawn starts the next incarnation of consumer lane/slot.
func (s *soak) spawn(laneName string, slot int) error {
	key := fmt.Sprintf("%s/%d", laneName, slot)
	s.mu.Lock()
	s.incarn[key]++
	inc := s.incarn[key]
	s.mu.Unlock()
	cc := consumerConfig{
		DSN: s.proxies[laneName].dsn("soak-" + laneName), Lane: laneName, Instance: fmt.Sprintf("%s#%d", key, inc),
		Workers: s.cfg.Workers, Coalesce: s.cfg.Coalesce, Lease: s.cfg.Lease,
	}
	js, err := json.Marshal(cc)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.exe)
	cmd.Env = append(os.Environ(), consumerEnv+"="+string(js))
	cmd.Stderr = s.conslog
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start consumer %s: %w", cc.Instance, err)
	}
	p := &proc{lane: laneName, slot: slot, instance: cc.Instance, cmd: cmd, done: make(chan struct{})}
	s.mu.Lock()
	s.procs[key] = p
	s.mu.Unlock()
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var r report
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				s.mu.Lock()
				s.reports[r.Instance] = r
				s.mu.Unlock()
			}
		}
		p.err = cmd.Wait()
		if !p.killed.Load() && !p.stopping.Load() {
			s.mu.Lock()
			s.unexpected = append(s.unexpected, fmt.Sprintf("consumer %s exited on its own: %v", p.instance, p.err))
			s.mu.Unlock()
		}
		close(p.done)
	}()
	return nil
}

// killAll SIGKILLs every consumer still running (on an early return).
func (s *soak) killAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.procs {
		select {
		case <-p.done:
		default:
			p.stopping.Store(true)
			_ = p.cmd.Process.Kill()
		}
	}
}

// produce publishes the lane's stream until stop: Rate new orders per
// second, plus duplicate deliveries making up DupShare of all deliveries —
// half of them concurrent copies of a recent order, half replays of any
// earlier order, delivered up to 3 s later, after newer orders. A small
// share of orders sleeps in the handler or at COMMIT, giving the injector
// its windows. The backlog is capped so the drain stays short.
func (s *soak) produce(ctx context.Context, l lane, rng *rand.Rand, stop <-chan struct{}) {
	st := s.stats[l.name]
	const tick = 50 * time.Millisecond
	perTick := max(1, s.cfg.Rate*int(tick)/int(time.Second))
	backlogCap := int64(max(200, 3*s.cfg.Rate))
	t := time.NewTicker(tick)
	defer t.Stop()
	var all []order
	var nextID int64
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var backlog int64
		if err := s.admin.QueryRowContext(ctx, "SELECT count(*) FROM "+l.q("inbox")).Scan(&backlog); err != nil || backlog > backlogCap {
			continue // the server is restarting, or the consumers are behind
		}
		var newOrders []order
		var batch []order
		var delays []int32
		var concurrent, replays int64
		for fresh := 0; fresh < perTick; {
			if len(all) > 0 && rng.Float64() < s.cfg.DupShare {
				if rng.IntN(2) == 0 {
					batch = append(batch, all[len(all)-1-rng.IntN(min(len(all), 20))])
					delays = append(delays, 0)
					concurrent++
				} else {
					batch = append(batch, all[rng.IntN(len(all))])
					delays = append(delays, int32(rng.IntN(3000)))
					replays++
				}
				continue
			}
			nextID++
			o := order{id: nextID, customer: 1 + rng.Int64N(int64(s.cfg.Customers)), points: 1 + rng.Int64N(500)}
			switch p := rng.Float64(); {
			case p < 0.06:
				o.handlerDelay = 5 + rng.Int32N(30)
			case p < 0.12:
				o.commitDelay = 10 + rng.Int32N(40)
			}
			all = append(all, o)
			newOrders = append(newOrders, o)
			batch = append(batch, o)
			delays = append(delays, 0)
			fresh++
		}
		for !s.publish(ctx, l, newOrders, batch, delays) {
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond): // retry the same batch
			}
		}
		st.orders.Add(int64(len(newOrders)))
		st.deliveries.Add(int64(len(batch)))
		st.dupConcurrent.Add(concurrent)
		st.dupReplay.Add(replays)
	}
}

// publish records the new orders and enqueues the deliveries in one
// transaction. It is safe to call again after an ambiguous failure: orders
// are inserted ON CONFLICT DO NOTHING, and an enqueued delivery twice is
// just one more duplicate.
func (s *soak) publish(ctx context.Context, l lane, orders, batch []order, delays []int32) bool {
	col := func(os []order, f func(order) int64) pq.Int64Array {
		a := make(pq.Int64Array, len(os))
		for i, o := range os {
			a[i] = f(o)
		}
		return a
	}
	id := func(o order) int64 { return o.id }
	cust := func(o order) int64 { return o.customer }
	pts := func(o order) int64 { return o.points }
	hd := func(o order) int64 { return int64(o.handlerDelay) }
	cd := func(o order) int64 { return int64(o.commitDelay) }
	d := make(pq.Int64Array, len(delays))
	for i, v := range delays {
		d[i] = int64(v)
	}
	tx, err := s.admin.BeginTx(ctx, nil)
	if err != nil {
		return false
	}
	defer func() { _ = tx.Rollback() }()
	if len(orders) > 0 {
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+l.q("orders")+` (order_id, customer_id, points)
SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) ON CONFLICT DO NOTHING`,
			col(orders, id), col(orders, cust), col(orders, pts)); err != nil {
			return false
		}
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+l.q("inbox")+` (order_id, customer_id, points, handler_delay_ms, commit_delay_ms, available_at)
SELECT o, c, p, h, cd, now() + d * interval '1 millisecond'
FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::int[], $5::int[], $6::int[]) AS u(o, c, p, h, cd, d)`,
		col(batch, id), col(batch, cust), col(batch, pts), col(batch, hd), col(batch, cd), d); err != nil {
		return false
	}
	return tx.Commit() == nil
}

// inject runs the fault schedule, one fault at a time, until its end.
func (s *soak) inject(ctx context.Context, start time.Time, sched []fault) error {
	rng := newRand(s.cfg.Seed, 99)
	for _, f := range sched {
		if wait := f.at - time.Since(start); wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return nil
			}
		}
		var ok bool
		var err error
		// A kill or a cut that finds no target in its 3 s is tried again,
		// up to 3 times, while its kind has not yet hit its lane.
		for try := 0; try < 4 && !ok && err == nil && ctx.Err() == nil; try++ {
			if try > 0 {
				s.mu.Lock()
				hit := s.faults[f.kind][f.lane] > 0
				s.mu.Unlock()
				if hit {
					break
				}
			}
			ok, err = s.injectOne(ctx, rng, f)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", f.kind, err)
		}
		s.mu.Lock()
		if ok {
			if s.faults[f.kind] == nil {
				s.faults[f.kind] = map[string]int{}
			}
			s.faults[f.kind][f.lane]++
		} else {
			s.missed[f.kind]++
		}
		s.mu.Unlock()
	}
	return nil
}

// injectOne injects one fault and reports whether it hit.
func (s *soak) injectOne(ctx context.Context, rng *rand.Rand, f fault) (bool, error) {
	switch f.kind {
	case faultKillHandler:
		return s.killBackend(ctx, f.lane, `(query LIKE '%pg_sleep%' OR query LIKE '%balances%' OR query LIKE '%point_ledger%') AND query NOT ILIKE 'commit%'`), nil
	case faultKillCommit:
		return s.killBackend(ctx, f.lane, `state = 'active' AND query ILIKE 'commit%'`), nil
	case faultAckLost:
		return s.proxies[f.lane].cutNextCommitAck(3 * time.Second), nil
	case faultSigkill:
		return s.sigkill(f.lane, 1+rng.IntN(s.cfg.Consumers))
	case faultRestart:
		return s.restartServer(ctx)
	case faultFailover:
		return s.failoverServer(ctx)
	}
	return false, fmt.Errorf("unknown fault %q", f.kind)
}

// killBackend terminates one of the lane's consumer backends inside an
// open transaction (it has a transaction id) that matches cond. It looks
// for one for up to 3 s and reports whether it killed one.
func (s *soak) killBackend(ctx context.Context, laneName, cond string) bool {
	q := `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE application_name = $1 AND backend_xid IS NOT NULL AND state IN ('active', 'idle in transaction') AND ` + cond + `
ORDER BY random() LIMIT 1`
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var killed bool
		err := s.inj.QueryRowContext(ctx, q, "soak-"+laneName).Scan(&killed)
		if err == nil && killed {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

// sigkill kills consumer lane/slot with SIGKILL — its in-flight
// transactions die with its connections, its leased deliveries come back
// when their leases expire — and starts its next incarnation.
func (s *soak) sigkill(laneName string, slot int) (bool, error) {
	s.mu.Lock()
	p := s.procs[fmt.Sprintf("%s/%d", laneName, slot)]
	s.mu.Unlock()
	p.killed.Store(true)
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return false, nil
	}
	<-p.done
	time.Sleep(200 * time.Millisecond)
	return true, s.spawn(laneName, slot)
}

// restartServer crashes the server with an immediate shutdown and starts
// it again (crash recovery).
func (s *soak) restartServer(ctx context.Context) (bool, error) {
	t0 := time.Now()
	if err := s.cl.Crash(); err != nil {
		return false, err
	}
	time.Sleep(300 * time.Millisecond)
	settings := s.settings
	if s.standby == nil {
		settings = nil // the promoted standby has no standby of its own
	}
	if err := s.cl.Start(ctx, settings...); err != nil {
		return false, err
	}
	s.mu.Lock()
	s.restart = time.Since(t0)
	s.mu.Unlock()
	return true, nil
}

// failoverServer kills the primary with SIGKILL (every process at once),
// promotes the synchronous standby, and moves the consumers' proxies to it,
// as an orchestrator would. The producer and the injector follow through
// target_session_attrs=read-write.
func (s *soak) failoverServer(ctx context.Context) (bool, error) {
	if s.standby == nil {
		return false, nil
	}
	t0 := time.Now()
	if err := s.cl.Kill(); err != nil {
		return false, err
	}
	if err := s.standby.Promote(ctx); err != nil {
		return false, err
	}
	for _, p := range s.proxies {
		p.retarget(s.standby)
	}
	s.mu.Lock()
	s.failover = time.Since(t0)
	s.mu.Unlock()
	// The old primary's directory stays until the end: it holds the
	// proxies' sockets and the consumers' log.
	s.cl, s.standby = s.standby, nil
	return true, nil
}

// rwDSN is a DSN listing the primary and the standby that connects to
// whichever accepts writes.
func (s *soak) rwDSN(app string) string {
	return s.dsnHosts + " user=postgres dbname=postgres sslmode=disable connect_timeout=5 target_session_attrs=read-write application_name=" + app
}

// waitSyncStandby waits until the primary reports the standby as
// synchronous.
func (s *soak) waitSyncStandby(ctx context.Context) error {
	db, err := sql.Open("postgres", s.cl.DSN("soak-probe"))
	if err != nil {
		return err
	}
	defer db.Close()
	for deadline := time.Now().Add(30 * time.Second); ; {
		var n int
		err := db.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_replication WHERE application_name = 'soak_standby' AND sync_state = 'sync'").Scan(&n)
		if err == nil && n == 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the standby did not become synchronous within 30s: %v", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// drain waits until every lane's inbox is empty and returns how many
// deliveries are left.
func (s *soak) drain(ctx context.Context) (int64, error) {
	start := time.Now()
	deadline := start.Add(s.cfg.DrainTimeout)
	lastLine := start
	for {
		var left int64
		var err error
		for _, l := range lanes {
			var n int64
			if err = s.admin.QueryRowContext(ctx, "SELECT count(*) FROM "+l.q("inbox")).Scan(&n); err != nil {
				break
			}
			left += n
		}
		if err == nil && left == 0 {
			return 0, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return left, err
		}
		if s.cfg.Progress > 0 && time.Since(lastLine) >= s.cfg.Progress && err == nil {
			lastLine = time.Now()
			fmt.Fprintf(s.out, "soak: draining for %v: %d deliveries left in the inbox\n", time.Since(start).Round(time.Second), left)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// stopConsumers asks every consumer to finish its current delivery and
// exit, and checks that each exited cleanly with no connection in use.
func (s *soak) stopConsumers(res *result) {
	s.mu.Lock()
	procs := make([]*proc, 0, len(s.procs))
	for _, p := range s.procs {
		procs = append(procs, p)
	}
	s.mu.Unlock()
	for _, p := range procs {
		p.stopping.Store(true)
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
			res.failf("consumer %s did not stop within 30s of SIGTERM", p.instance)
			continue
		}
		if p.err != nil {
			res.failf("consumer %s exited with %v (see %s)", p.instance, p.err, s.conslog.Name())
		}
		s.mu.Lock()
		r, ok := s.reports[p.instance]
		s.mu.Unlock()
		switch {
		case !ok || !r.Final:
			res.failf("consumer %s sent no final report", p.instance)
		case r.InUse != 0:
			res.failf("connection leak: consumer %s had %d connections in use at exit", p.instance, r.InUse)
		}
	}
	s.mu.Lock()
	for _, u := range s.unexpected {
		res.failf("%s", u)
	}
	s.mu.Unlock()
}

// checkBackends checks that no client backend is left on the cluster but
// the audit's own, once every consumer has exited.
func (s *soak) checkBackends(ctx context.Context, db *sql.DB, res *result) {
	var n int
	var who string
	for deadline := time.Now().Add(10 * time.Second); ; {
		err := db.QueryRowContext(ctx, `SELECT count(*), coalesce(string_agg(application_name || ' (' || state || ')', ', '), '')
FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`).Scan(&n, &who)
		if err != nil {
			res.failf("pg_stat_activity: %v", err)
			return
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			res.failf("connection leak: %d client backends left on the cluster after every consumer exited: %s", n, who)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// newRand returns the random stream number stream of seed: 0 is the fault
// schedule, 1 and up the lanes' producers, 99 the injector's choices.
func newRand(seed, stream uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, stream)) }
