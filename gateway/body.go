package gateway

import (
	"bytes"
	"fmt"
	"io"
	"strconv"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"

	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/internal/parkconn"
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

// headerBodyRefused marks a request whose declared Content-Length is over
// the server's limit for it (markDeclaredBody); its value is the limit. A
// client's own header of this name is dropped.
const headerBodyRefused = "X-Quarry-Body-Refused"

// markDeclaredBody runs on a request's headers, before the server reads its
// body. With StreamRequestBody the server reads up to 8 KiB of a body before
// the app sees the request, even one whose Content-Length is over limit: a
// client that sent less and waits for an answer before sending the rest
// would wait for nothing. So such a request goes on without its body
// (Content-Length 0, no Expect: 100-continue, which would invite the body),
// marked for refuseDeclaredBody.
func markDeclaredBody(h *fasthttp.RequestHeader, limit int) {
	h.Del(headerBodyRefused)
	if h.ContentLength() > limit {
		h.Set(headerBodyRefused, strconv.Itoa(limit))
		h.SetContentLength(0)
		h.Del(fiber.HeaderExpect)
	}
}

// refuseDeclaredBody answers a request that markDeclaredBody marked with
// 413, before anything else (auth included) looks at it, and closes the
// connection after the answer: the body the client still sends is never
// read as a request. It reports whether it answered.
func (g *Gateway) refuseDeclaredBody(c *fiber.Ctx) bool {
	v := c.Request().Header.Peek(headerBodyRefused)
	if len(v) == 0 {
		return false
	}
	limit, _ := strconv.ParseInt(string(v), 10, 64)
	g.writeError(c, tooLarge(limit))
	c.Locals(bodyLocal, &bodyReader{err: tooLarge(limit)}) // finishBody reads none of it
	return true
}

// openBody returns a reader of c's request body bounded by limit. A declared
// Content-Length over limit is refused at once (413): nothing of the body
// is read, and the connection closes after the answer (finishBody).
func openBody(c *fiber.Ctx, limit int64) (*bodyReader, error) {
	if cl := c.Request().Header.ContentLength(); int64(cl) > limit {
		err := tooLarge(limit)
		c.Locals(bodyLocal, &bodyReader{err: err})
		return nil, err
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
// rest as the next request (a body refused as too large, by its declared
// length or as it passed the limit, is not drained).
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
		parkconn.LingerOnClose(c.Context().Conn())
	}
}
