package gateway

import (
	"bytes"
	"fmt"
	"io"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/bytebufferpool"

	"github.com/quarryhq/quarry/internal/errclass"
)

// bodyLocal is the fiber Locals key of the request's *bodyReader.
const bodyLocal = "quarry.body"

// drainLimit is how much of an unread request body the gateway reads and
// discards to keep the client's connection alive; past it the connection
// is closed after the answer.
const drainLimit = 64 << 10

// bodyReader reads the client's request body (streamed by the server: the
// app runs with StreamRequestBody) up to a limit, and remembers how reading
// ended: at the end of the body, too large, or failed. It is used by one
// request goroutine at a time.
type bodyReader struct {
	r     io.Reader
	limit int64
	n     int64
	eof   bool
	err   error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	if b.err != nil {
		return 0, b.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	// Read at most one byte past the limit: that byte proves the excess.
	if rem := b.limit + 1 - b.n; int64(len(p)) > rem {
		p = p[:rem]
	}
	n, err := b.r.Read(p)
	b.n += int64(n)
	if over := b.n - b.limit; over > 0 {
		b.err = tooLarge(b.limit)
		return n - int(over), b.err
	}
	switch {
	case err == io.EOF:
		b.eof = true
	case err != nil:
		b.err = &errclass.BodyReadError{Err: err}
		return n, b.err
	}
	return n, err
}

// tooLarge is the 413 error of a body over limit bytes.
func tooLarge(limit int64) error {
	return fmt.Errorf("body: larger than the limit of %d bytes: %w", limit, errclass.ErrTooLarge)
}

// openBody returns a reader of c's request body bounded by limit. A declared
// Content-Length over limit is refused at once (413).
func openBody(c *fiber.Ctx, limit int64) (*bodyReader, error) {
	if cl := c.Request().Header.ContentLength(); int64(cl) > limit {
		return nil, tooLarge(limit)
	}
	r := c.Context().RequestBodyStream()
	if r == nil {
		// Not streamed (the app was served without StreamRequestBody, e.g.
		// by an adapter): the body is in memory already.
		r = bytes.NewReader(c.Request().Body())
	}
	br := &bodyReader{r: r, limit: limit}
	c.Locals(bodyLocal, br)
	return br, nil
}

// readBody reads c's whole request body, bounded by limit, into a pooled
// buffer that the caller returns with bytebufferpool.Put.
func readBody(c *fiber.Ctx, limit int64) (*bytebufferpool.ByteBuffer, error) {
	br, err := openBody(c, limit)
	if err != nil {
		return nil, err
	}
	bb := bytebufferpool.Get()
	if _, err := bb.ReadFrom(br); err != nil {
		bytebufferpool.Put(bb)
		return nil, err
	}
	return bb, nil
}

// finishBody runs after every handler. The server does not skip what a
// handler left unread of a streamed body, so it drains a small rest, and
// otherwise closes the connection after the answer instead of reading the
// rest as the next request.
func finishBody(c *fiber.Ctx) {
	br, _ := c.Locals(bodyLocal).(*bodyReader)
	if br == nil {
		r := c.Context().RequestBodyStream()
		if r == nil {
			return
		}
		br = &bodyReader{r: r, limit: drainLimit}
	}
	if br.eof {
		return
	}
	if br.err == nil {
		br.limit = br.n + drainLimit
		_, _ = io.Copy(io.Discard, br)
	}
	if !br.eof {
		c.Response().SetConnectionClose()
		lingerOnClose(c.Context().Conn())
	}
}
