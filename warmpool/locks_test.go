package warmpool_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
)

// logRecorder is a slog.Handler that keeps every record's message and
// "lock" attribute. Safe for concurrent use.
type logRecorder struct {
	mu    sync.Mutex
	lines []lockLine
}

// lockLine is one logged line about a lock.
type lockLine struct{ msg, lock string }

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	l := lockLine{msg: rec.Message}
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "lock" {
			l.lock = a.Value.String()
		}
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, l)
	return nil
}

func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *logRecorder) WithGroup(string) slog.Handler      { return r }

// about returns the messages logged about lock, oldest first.
func (r *logRecorder) about(lock string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, l := range r.lines {
		if l.lock == lock {
			out = append(out, l.msg)
		}
	}
	return out
}

// A replica that loses a lock says why, and only the truth: at Close it
// released the lock itself (a single node has no other replica to take
// the job over), and when the store fails it cannot know who runs the job.
func TestManager_Locks_LogWhyALockIsNoLongerHeld(t *testing.T) {
	jobs := []string{"pool/default", "reaper", "orphans"}
	tests := []struct {
		name string
		lose func(t *testing.T, e *env, store *scriptedStore)
		want string
	}{
		{name: "closed", lose: func(t *testing.T, e *env, _ *scriptedStore) {
			require.NoError(t, e.m.Close(t.Context()))
		}, want: "lock released: this replica is closing"},
		// Close while renewals are in flight: their canceled calls say
		// nothing of the store (make test saw "the store did not answer"
		// logged at a single node's Close).
		{name: "closed while renewing", lose: func(t *testing.T, e *env, store *scriptedStore) {
			entered := make(chan struct{}, 16)
			store.setTryLockErr(func(ctx context.Context) error {
				entered <- struct{}{}
				<-ctx.Done()
				return ctx.Err()
			})
			select {
			case <-entered:
			case <-time.After(waitFor):
				t.Fatal("no lock renewal began")
			}
			require.NoError(t, e.m.Close(t.Context()))
		}, want: "lock released: this replica is closing"},
		{name: "store fails", lose: func(t *testing.T, e *env, store *scriptedStore) {
			store.setTryLockErr(func(context.Context) error { return errors.New("store unreachable") })
			for _, lock := range jobs {
				require.Eventually(t, func() bool { return !lockHeld(t, e.reg, lock) }, waitFor, tick, lock)
			}
		}, want: "lock no longer held: the store did not answer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logs := &logRecorder{}
			var store *scriptedStore
			e := newEnvSetup(t, fastConfig(), func(e *env) {
				e.logger = slog.New(logs)
				e.wrap = func(s warmpool.Store) warmpool.Store { store = newScriptedStore(s); return store }
			}, testPool(0, 1))
			for _, lock := range jobs {
				require.Eventually(t, func() bool { return lockHeld(t, e.reg, lock) }, waitFor, tick, lock)
			}
			tt.lose(t, e, store)
			for _, lock := range jobs {
				lines := logs.about(lock)
				require.NotEmpty(t, lines, lock)
				assert.True(t, strings.HasPrefix(lines[len(lines)-1], tt.want), "%s: %q", lock, lines)
				for _, l := range lines {
					assert.NotContains(t, l, "another replica runs the job", lock)
				}
			}
		})
	}
}
