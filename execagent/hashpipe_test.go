package execagent

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The pipe hands on every byte in order and hashes them all, at every
// size around its chunk's, through reads of odd sizes.
func TestHashPipe_BytesAndHash(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, size := range []int{0, 1, hashPipeChunk - 1, hashPipeChunk, hashPipeChunk + 1, hashPipeChunks*hashPipeChunk + 7, 3 * hashPipeChunks * hashPipeChunk} {
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		p := newHashPipe(iotestHalfReader{bytes.NewReader(data)})
		var got bytes.Buffer
		buf := make([]byte, 777)
		for {
			n, err := p.Read(buf)
			got.Write(buf[:n])
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
		}
		n, err := p.Read(buf)
		assert.Zero(t, n)
		assert.ErrorIs(t, err, io.EOF, "EOF again")
		want := sha256.Sum256(data)
		assert.Equal(t, want[:], p.Sum(), "size %d", size)
		assert.True(t, bytes.Equal(data, got.Bytes()), "size %d: the bytes, in order", size)
	}
}

// iotestHalfReader reads at most half of what it is asked for, as a
// socket may.
type iotestHalfReader struct{ r io.Reader }

func (h iotestHalfReader) Read(b []byte) (int, error) { return h.r.Read(b[:(len(b)+1)/2]) }

// A read error is Read's after the bytes before it, and stays.
func TestHashPipe_ErrorAfterTheBytesBeforeIt(t *testing.T) {
	boom := errors.New("connection reset")
	p := newHashPipe(io.MultiReader(bytes.NewReader([]byte("abc")), errReader{boom}))
	got, err := io.ReadAll(p)
	assert.Equal(t, "abc", string(got))
	assert.ErrorIs(t, err, boom)
	_, err = p.Read(make([]byte, 1))
	assert.ErrorIs(t, err, boom)
	p.Close()
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// A reader that stops early (a refused archive) closes the pipe: its
// goroutine returns though the body has more, and the rest of the body is
// the caller's to drain.
func TestHashPipe_CloseEarlyGivesTheBodyBack(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 20*hashPipeChunk)
	src := bytes.NewReader(data)
	p := newHashPipe(src)
	_, err := io.ReadFull(p, make([]byte, 10))
	require.NoError(t, err)
	p.Close()
	p.Close()
	ahead := int(src.Size()) - src.Len()
	assert.LessOrEqual(t, ahead, hashPipeChunks*hashPipeChunk, "read ahead at most its buffers")
	rest, err := io.ReadAll(src)
	require.NoError(t, err)
	assert.Equal(t, len(data)-ahead, len(rest))
}
