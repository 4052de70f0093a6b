package execagent

import (
	"crypto/sha256"
	"errors"
	"hash"
	"io"
)

// hashPipe's chunks: hashPipeChunks buffers of hashPipeChunk bytes are
// all it holds, read ahead of its reader.
const (
	hashPipeChunk  = 256 << 10
	hashPipeChunks = 4
)

// hashPipe reads a restore's body on a goroutine of its own, in chunks,
// and hashes each before its Read hands it on: the SHA-256 of a body runs
// beside the extraction (on the other core), not in line with it. A
// profile of a 100 MB restore had a tenth of its CPU in the hash.
type hashPipe struct {
	full chan hashChunk // read and hashed, in order; closed at the end
	free chan []byte    // the buffers Read is done with
	stop chan struct{}  // closed by Close
	done chan struct{}  // closed when the reading goroutine has returned
	sum  hash.Hash      // the goroutine's until done is closed
	// Read's state: the chunk it reads from, its buffer, and the error
	// that ends the stream once the chunk is read.
	cur, buf []byte
	err      error
	closed   bool
}

// hashChunk is a chunk of the body and the error its read ended with.
type hashChunk struct {
	b   []byte
	err error
}

// newHashPipe starts reading src.
func newHashPipe(src io.Reader) *hashPipe {
	p := &hashPipe{
		full: make(chan hashChunk, hashPipeChunks),
		free: make(chan []byte, hashPipeChunks),
		stop: make(chan struct{}),
		done: make(chan struct{}),
		sum:  sha256.New(),
	}
	for range hashPipeChunks {
		p.free <- make([]byte, hashPipeChunk)
	}
	go p.run(src)
	return p
}

// run reads src into free buffers until it ends or Close stops it.
func (p *hashPipe) run(src io.Reader) {
	defer close(p.done)
	defer close(p.full)
	for {
		var buf []byte
		select {
		case buf = <-p.free:
		case <-p.stop:
			return
		}
		n, err := io.ReadFull(src, buf)
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = io.EOF
		}
		p.sum.Write(buf[:n])
		select {
		case p.full <- hashChunk{b: buf[:n], err: err}:
		case <-p.stop:
			return
		}
		if err != nil {
			return
		}
	}
}

// Read reads the body, in order; it returns the error the body's read
// ended with (io.EOF at its end) after the bytes before it.
func (p *hashPipe) Read(b []byte) (int, error) {
	for len(p.cur) == 0 {
		if p.buf != nil {
			p.free <- p.buf[:cap(p.buf)] // never blocks: free holds every buffer
			p.buf = nil
		}
		if p.err != nil {
			return 0, p.err
		}
		c, ok := <-p.full
		if !ok {
			p.err = io.ErrClosedPipe
			continue
		}
		p.cur, p.buf, p.err = c.b, c.b, c.err
	}
	n := copy(b, p.cur)
	p.cur = p.cur[n:]
	return n, nil
}

// Close stops the reading goroutine and waits for it: after Close, the
// body is its caller's again (what the pipe read ahead of Read is lost).
// It may be called more than once.
func (p *hashPipe) Close() {
	if !p.closed {
		p.closed = true
		close(p.stop)
	}
	<-p.done
}

// Sum closes the pipe and returns the SHA-256 of every byte it read: the
// body's when Read had returned io.EOF.
func (p *hashPipe) Sum() []byte {
	p.Close()
	return p.sum.Sum(nil)
}
