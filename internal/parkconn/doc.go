// Package parkconn is the gateway's server-side connection handling, below
// the HTTP server (fasthttp): what bounds a connection's waits, what it
// costs while it waits for its next request, and what Shutdown can close.
//
// Files:
//   - idle.go: IdleConn bounds every Read and Write by an idle timeout
//     (streams that keep moving are not cut) and lingers on Close after an
//     early answer; Set tracks a listener's open connections so that
//     Shutdown can close those that never sent a request
//     (Set.CloseUnserved); NewIdleListener wraps every accepted connection
//     in an IdleConn tracked in a Set.
//   - park.go: Listener serves a connection with the server's ServeConn
//     only while it has a request to read; between requests it is parked
//     in a goroutine of its own blocked on a one-byte read, holding none of
//     the server's buffers (docs/ARCHITECTURE.md, "Gateway memory at
//     10,000"), after lingering Config.Linger on the goroutine that
//     served it, where a request that comes in time is served at once.
//     Conn is such a connection; ConnState is the server's
//     ConnState hook that parks it after an answer; RequestStarted is
//     called by the app for every request.
//
// The layers stack as the gateway builds them: Listener over (TLS over)
// the IdleListener over the socket. AsConn, AsIdleConn, MarkServed and
// LingerOnClose find their layer under the ones above.
//
// It imports fasthttp (ConnState, RequestCtx) and the standard library
// only: no Quarry package and no fiber, so that any server built on
// fasthttp can use it.
package parkconn
