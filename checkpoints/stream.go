package checkpoints

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
)

// meter counts and hashes the bytes of a stream that must not exceed a
// limit, with a sticky error: the part DigestReader and the reader
// NewVerifyReader returns share.
type meter struct {
	n, limit int64
	h        hash.Hash
	err      error
}

func newMeter(limit int64) meter { return meter{limit: limit, h: sha256.New()} }

// read reads into p from r, counting and hashing what came. Past the
// limit it fails, for good, with over's error (the bytes past it are not
// returned); an error other than io.EOF is kept too.
func (m *meter) read(r io.Reader, p []byte, over func() error) (int, error) {
	if m.err != nil {
		return 0, m.err
	}
	n, err := r.Read(p)
	m.n += int64(n)
	if m.n > m.limit {
		m.err = over()
		return 0, m.err
	}
	m.h.Write(p[:n])
	if err != nil && err != io.EOF {
		m.err = err
	}
	return n, err
}

func (m *meter) sum() string { return hex.EncodeToString(m.h.Sum(nil)) }

// DigestReader is the reader a Put copies its archive through: it counts
// and hashes what passes, refuses to read past a limit, and checks its
// context between reads. Not safe for concurrent use (one Put reads it).
type DigestReader struct {
	ctx  context.Context
	r    io.Reader
	m    meter
	over func() error // the error past the limit
}

// NewDigestReader returns a DigestReader of r that allows maxBytes bytes.
// Reading byte maxBytes+1 makes it fail with ErrTooLarge (it never asks r
// for more than maxBytes+1 bytes in all); after ctx ends it fails with
// ctx's error. A Read that blocks in r is not interrupted: r must end with
// ctx itself (an HTTP body does).
func NewDigestReader(ctx context.Context, r io.Reader, maxBytes int64) *DigestReader {
	d := &DigestReader{ctx: ctx, r: r, m: newMeter(maxBytes)}
	d.over = func() error { return fmt.Errorf("archive larger than %d bytes: %w", d.m.limit, ErrTooLarge) }
	return d
}

// Read reads from the underlying reader. Errors are sticky: once it failed
// (ErrTooLarge or a *BudgetError, ctx, the reader's error) every Read
// returns that error.
func (d *DigestReader) Read(p []byte) (int, error) {
	if err := d.ctx.Err(); err != nil && d.m.err == nil {
		d.m.err = err
	}
	if room := d.m.limit + 1 - d.m.n; int64(len(p)) > room {
		p = p[:room]
	}
	return d.m.read(d.r, p, d.over)
}

// Err returns the error that stopped the reader (nil at io.EOF or while
// it reads), so that a store reports the cause however an upload library
// wrapped it.
func (d *DigestReader) Err() error { return d.m.err }

// Size returns how many bytes were read.
func (d *DigestReader) Size() int64 { return d.m.n }

// SHA256 returns the hex sha256 of what was read so far (the archive's,
// once read to io.EOF).
func (d *DigestReader) SHA256() string { return d.m.sum() }

// verifyReader is what NewVerifyReader returns.
type verifyReader struct {
	rc  io.ReadCloser
	sha string
	m   meter
}

// NewVerifyReader returns the reader an Open returns: rc's bytes, hashed
// and counted. At rc's io.EOF it returns io.EOF when exactly size bytes
// hashing to sha256Hex came, and an error wrapping ErrCorrupt otherwise;
// it fails with ErrCorrupt as soon as more than size bytes come. Other
// errors of rc pass unchanged. Close closes rc. Not safe for concurrent
// use.
func NewVerifyReader(rc io.ReadCloser, size int64, sha256Hex string) io.ReadCloser {
	return &verifyReader{rc: rc, sha: sha256Hex, m: newMeter(size)}
}

func (v *verifyReader) Read(p []byte) (int, error) {
	n, err := v.m.read(v.rc, p, func() error {
		return fmt.Errorf("stored archive is longer than its %d bytes: %w", v.m.limit, ErrCorrupt)
	})
	if err != io.EOF {
		return n, err
	}
	switch {
	case v.m.n != v.m.limit:
		v.m.err = fmt.Errorf("stored archive has %d bytes, not %d: %w", v.m.n, v.m.limit, ErrCorrupt)
	case v.m.sum() != v.sha:
		v.m.err = fmt.Errorf("stored archive does not hash to its sha256 %s: %w", v.sha, ErrCorrupt)
	default:
		v.m.err = io.EOF
	}
	return n, v.m.err
}

func (v *verifyReader) Close() error { return v.rc.Close() }
