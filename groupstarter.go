package idempotent

import "context"

// A GroupStarter is an [Observer] that is also told when each transaction
// of a coalesced group ([WithCoalescing], and the coalesced deliveries of
// an adapter's delivery path) starts. When the Observer given to
// [WithObserver] implements GroupStarter, the middleware calls StartGroup
// before each transaction a group runs — one, or more when the
// transaction is retried or runs again without a member that failed on its
// own — on the group's goroutine, with the members that transaction runs.
//
// The context StartGroup returns is the one the group's own statements
// (its claims, fence, COMMIT) run with; each member's handler still runs
// with its own delivery's context. end is called once, when the
// transaction has ended: with nil when it committed, else with why it did
// not. A tracing observer starts one span per transaction there, with a
// link to each member's delivery (package otelmetrics does); StartGroup
// must return a context derived from ctx, a nil return leaves ctx
// unchanged, and a nil end is not called.
type GroupStarter interface {
	StartGroup(ctx context.Context, g Group) (context.Context, func(err error))
}

// Group is one transaction of a coalesced group, for a GroupStarter.
type Group struct {
	// Consumer is the Middleware's consumer name.
	Consumer string
	// Members are the deliveries the transaction runs, in the order it
	// claims them (key order).
	Members []GroupMember
}

// GroupMember is one delivery of a Group.
type GroupMember struct {
	// Key is the message key.
	Key string
	// Ctx is the context the delivery's call runs with: the caller's, as
	// a Starter derived it; its span (an adapter's consumer span, say) is
	// the delivery's.
	Ctx context.Context
}

// groupStart returns what a coalesced group calls before each of its
// transactions (coalesce.Driver.Start) for a Middleware with observer o of
// consumer: o's StartGroup, or nil when o is no GroupStarter.
func groupStart(o Observer, consumer string) func(context.Context, []*member) (context.Context, func(error)) {
	s, ok := o.(GroupStarter)
	if !ok {
		return nil
	}
	return func(ctx context.Context, live []*member) (context.Context, func(error)) {
		g := Group{Consumer: consumer, Members: make([]GroupMember, len(live))}
		for i, mb := range live {
			g.Members[i] = GroupMember{Key: mb.Key, Ctx: mb.Ctx}
		}
		sctx, end := s.StartGroup(ctx, g)
		if sctx == nil {
			sctx = ctx
		}
		if end == nil {
			end = func(error) {}
		}
		return sctx, end
	}
}
