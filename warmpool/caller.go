package warmpool

import "context"

// Callers: the manager operation on whose behalf a store call runs, as
// CallerOf reports it. A store (or the HTTP client under it) may count its
// calls by caller, e.g. to tell the DynamoDB calls of one acquire from the
// background work's.
const (
	CallerAcquire   = "acquire"
	CallerGet       = "get"
	CallerHeartbeat = "heartbeat"
	CallerRelease   = "release"
	CallerList      = "list"
	CallerPools     = "pools"
	CallerCheckTask = "check_task"
	CallerReady     = "ready"
	CallerReconcile = "reconcile" // a pool's reconciler and the launches it starts
	CallerReaper    = "reaper"
	CallerOrphans   = "orphans"
	CallerEvents    = "events"    // handling providers' task events
	CallerLifecycle = "lifecycle" // Start and Close
)

type callerKey struct{}

// ContextWithCaller returns ctx marked as running for caller (one of the
// Caller constants): the manager marks every store call it makes; tests
// and adapters may mark their own.
func ContextWithCaller(ctx context.Context, caller string) context.Context {
	return context.WithValue(ctx, callerKey{}, caller)
}

// CallerOf returns the Caller constant that the manager attached to ctx
// before calling the store, or "" when ctx carries none.
func CallerOf(ctx context.Context) string {
	s, _ := ctx.Value(callerKey{}).(string)
	return s
}
