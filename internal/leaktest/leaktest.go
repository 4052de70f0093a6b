// Package leaktest holds what the goleak checks of Quarry's long-lived
// loops share: the goroutines that are not theirs to end. Test code only.
package leaktest

import "go.uber.org/goleak"

// FastHTTP ignores fasthttp's own goroutines that outlive a stopped server
// or client by design: the worker pool's cleaner (it notices the stop after
// its 10 s sleep), the Date-header clock (one per process, for good), and a
// client's idle-connection cleaner (it sleeps out its interval and ends
// once its pool is empty).
func FastHTTP() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
	}
}
