package checkpointtest

import (
	"context"
	"io"
	"math/rand/v2"
	"runtime"
	"sync"
	"time"
)

// Corrupter is implemented by a backend's test harness: it damages a
// stored archive so that the suite checks Open's verification.
type Corrupter interface {
	// Corrupt replaces the stored bytes of checkpoint id's archive with
	// mutate's result (mutate gets the stored bytes). Only for the small
	// archives the suite corrupts.
	Corrupt(ctx context.Context, id string, mutate func([]byte) []byte) error
}

// BlobCounter is implemented by a backend's test harness: it counts what
// the store holds of archives, so that the suite checks that a failed Put
// keeps nothing and that Delete and Purge reclaim space.
type BlobCounter interface {
	// Blobs returns how many archives the store holds, counting partial
	// ones (temp files, incomplete multipart uploads).
	Blobs(ctx context.Context) (int, error)
}

// Clock is the suite's clock: a store tells time only by the clock.Clock
// it was given. Safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock at t.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// source is a deterministic stream of incompressible bytes (ChaCha8 from a
// seed), generated as it is read: an archive of any size that is never in
// memory. It counts what was read and calls every (when set) after each
// 4 MiB.
type source struct {
	rng   *rand.ChaCha8
	left  int64
	read  int64
	every func()
}

const sampleEvery = 4 << 20

func newSource(seed byte, size int64) *source {
	var s [32]byte
	s[0] = seed
	return &source{rng: rand.NewChaCha8(s), left: size}
}

func (s *source) Read(p []byte) (int, error) {
	if s.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > s.left {
		p = p[:s.left]
	}
	n, _ := s.rng.Read(p) // ChaCha8.Read fills p and never fails
	before := s.read
	s.read += int64(n)
	s.left -= int64(n)
	if s.every != nil && before/sampleEvery != s.read/sampleEvery {
		s.every()
	}
	return n, nil
}

// bytesOf returns the whole stream of seed and size (small archives only).
func bytesOf(seed byte, size int64) []byte {
	b, _ := io.ReadAll(newSource(seed, size))
	return b
}

// failingReader gives src's bytes and then fails with err once it gave
// after bytes; cancel, when set, is called there instead of failing.
type failingReader struct {
	src    io.Reader
	after  int64
	err    error
	cancel context.CancelFunc
	n      int64
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n >= f.after {
		if f.cancel != nil {
			f.cancel()
			// A reader tied to the context stops with it, as an HTTP body does.
			return 0, context.Canceled
		}
		return 0, f.err
	}
	if int64(len(p)) > f.after-f.n {
		p = p[:f.after-f.n]
	}
	n, err := f.src.Read(p)
	f.n += int64(n)
	return n, err
}

// heap measures the growth of the live heap over a baseline: each sample
// forces a collection first, so garbage does not count.
type heap struct {
	mu         sync.Mutex
	base, peak uint64
}

func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func newHeap() *heap {
	b := liveHeap()
	return &heap{base: b, peak: b}
}

func (h *heap) sample() {
	v := liveHeap()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.peak = max(h.peak, v)
}

// growth returns how far the peak rose above the baseline.
func (h *heap) growth() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return int64(h.peak) - int64(h.base)
}
