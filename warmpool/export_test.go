package warmpool

import "time"

// SetLostAnswerWait sets adoptLost's first wait for a test and returns
// what puts it back.
func SetLostAnswerWait(d time.Duration) (restore func()) {
	old := lostAnswerWait.Swap(int64(d))
	return func() { lostAnswerWait.Store(old) }
}
