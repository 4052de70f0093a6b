// Package clock holds Quarry's one source of time for components that take
// it as a dependency: the Clock interface and System, the one real clock.
// A component's Deps (or Config) has a Clock field, nil meaning System;
// tests pass fakes that implement Clock.
//
// It imports nothing from Quarry, so that every package can use it (the
// relay's brokers, which must not import the warm pool, included).
package clock

import "time"

// Clock tells the time. Implementations are safe for concurrent use.
type Clock interface {
	Now() time.Time
}

// System is the real clock: time.Now.
type System struct{}

// Now returns time.Now().
func (System) Now() time.Time { return time.Now() }
