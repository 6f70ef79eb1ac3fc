package idempotent

import "context"

// A Starter is an [Observer] that is also told when a delivery starts. When
// the Observer given to [WithObserver] implements Starter, the middleware
// calls Start once per call of ProcessMessage, ProcessNatural and
// ProcessMessageTx (and of WrapMessage and WrapMessageTx, built on them), before the key
// is checked and before the first attempt, on the caller's goroutine.
//
// The context Start returns replaces the caller's for the rest of the call:
// every attempt's transaction and handler run with it, and the Retry and
// Outcome calls of that delivery receive it. A tracing observer starts a
// span there, so the handler's own spans (of its SQL driver, say) nest under
// the delivery's, and ends it in Outcome. Start must return a context
// derived from ctx; a nil return leaves ctx unchanged.
//
// ProcessMessages, ProcessMessagesTx, WrapMessages and WrapMessagesTx do
// not call Start: their observer hears one Outcome per message, with the
// caller's context.
type Starter interface {
	Start(ctx context.Context, consumer, key string) context.Context
}

// startDelivery lets the observer, if it is a Starter, derive the context
// of the delivery of key.
func (m *Middleware) startDelivery(ctx context.Context, key string) context.Context {
	s, ok := m.observer.(Starter)
	if !ok {
		return ctx
	}
	if sctx := s.Start(ctx, m.consumer, key); sctx != nil {
		return sctx
	}
	return ctx
}
