package execagent

import (
	"bytes"
	"context"
	"encoding/base64"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// binaryBytes returns n bytes of every value, NUL, 0xff and broken UTF-8
// sequences among them, the same for the same seed.
func binaryBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// writeWorkFile writes b to name in the agent's workdir.
func writeWorkFile(t *testing.T, a *testAgent, name string, b []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(a.cfg.Workdir, name), b, 0o644))
}

// streamBytes reads an exec event stream up to its exit event and returns
// the decoded bytes of its stdout and stderr events and the result.
func streamBytes(t *testing.T, st *agentapi.EventStream, enc string) (stdout, stderr []byte, res agentapi.ExecResult) {
	t.Helper()
	for {
		ev, err := st.Next()
		require.NoError(t, err)
		if ev.Name == agentapi.EventExit {
			require.NoError(t, ev.Decode(&res))
			return stdout, stderr, res
		}
		var c agentapi.StreamChunk
		require.NoError(t, ev.Decode(&c))
		b, err := agentapi.DecodeOutput(enc, c.Data)
		require.NoError(t, err, "every event's data decodes on its own")
		switch ev.Name {
		case agentapi.EventStdout:
			stdout = append(stdout, b...)
		case agentapi.EventStderr:
			stderr = append(stderr, b...)
		default:
			require.Failf(t, "unexpected event", "%s", ev.Name)
		}
	}
}

func decodeBase64(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	require.NoError(t, err, "%q", s)
	return b
}

func TestExec_Base64_JSONCarriesExactBytes(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	data := binaryBytes(200<<10, 1)
	writeWorkFile(t, a, "data.bin", data)

	res, err := a.client.Exec(ctx, agentapi.ExecRequest{Command: `printf '\000\001\377'; printf '\377\000' >&2`, Encoding: agentapi.EncodingBase64})
	require.NoError(t, err)
	assert.Equal(t, []byte{0, 1, 0xff}, decodeBase64(t, res.Stdout))
	assert.Equal(t, []byte{0xff, 0}, decodeBase64(t, res.Stderr))
	assert.False(t, res.Truncated)

	res, err = a.client.Exec(ctx, agentapi.ExecRequest{Command: "cat data.bin", Encoding: agentapi.EncodingBase64, MaxOutputBytes: 1 << 20})
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, decodeBase64(t, res.Stdout)), "200 KiB of every byte value arrive exactly")

	// The default is unchanged: text, with U+FFFD for what is not UTF-8.
	for _, enc := range []string{"", agentapi.EncodingUTF8} {
		res, err = a.client.Exec(ctx, agentapi.ExecRequest{Command: `printf '\000\001\377a'`, Encoding: enc})
		require.NoError(t, err)
		assert.Equal(t, "\x00\x01\uFFFDa", res.Stdout, "encoding %q", enc)
	}
}

func TestExec_Base64_StdinCarriesExactBytes(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	in := binaryBytes(100<<10, 2)
	res, err := a.client.Exec(ctx, agentapi.ExecRequest{Command: "cat", StdinBase64: base64.StdEncoding.EncodeToString(in),
		Encoding: agentapi.EncodingBase64, MaxOutputBytes: 1 << 20})
	require.NoError(t, err)
	assert.Equal(t, 0, res.ExitCode)
	assert.True(t, bytes.Equal(in, decodeBase64(t, res.Stdout)), "stdin_base64 reaches the command byte for byte")

	st, err := a.client.ExecStream(ctx, agentapi.ExecRequest{Command: "wc -c", StdinBase64: base64.StdEncoding.EncodeToString([]byte{0, 0xff, '\n'})})
	require.NoError(t, err)
	defer st.Close()
	out, _, res := streamBytes(t, st, agentapi.EncodingUTF8)
	assert.Equal(t, "3\n", strings.TrimLeft(string(out), " "), "streams take stdin_base64 too")
	assert.Equal(t, 0, res.ExitCode)
}

// The output cap counts bytes of output, not characters of base64.
func TestExec_Base64_CapCountsRawBytes(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	const capBytes = 12 // 16 characters of base64
	cmd := `head -c 100000 /dev/zero | tr '\0' '\377'; printf '\377\377' >&2`
	want := bytes.Repeat([]byte{0xff}, capBytes)

	res, err := a.client.Exec(ctx, agentapi.ExecRequest{Command: cmd, Encoding: agentapi.EncodingBase64, MaxOutputBytes: capBytes})
	require.NoError(t, err)
	assert.Equal(t, want, decodeBase64(t, res.Stdout))
	assert.Equal(t, []byte{0xff, 0xff}, decodeBase64(t, res.Stderr))
	assert.True(t, res.Truncated)

	st, err := a.client.ExecStream(ctx, agentapi.ExecRequest{Command: cmd, Encoding: agentapi.EncodingBase64, MaxOutputBytes: capBytes})
	require.NoError(t, err)
	defer st.Close()
	out, errOut, res := streamBytes(t, st, agentapi.EncodingBase64)
	assert.Equal(t, want, out)
	assert.Equal(t, []byte{0xff, 0xff}, errOut)
	assert.True(t, res.Truncated, "the exit event says the stream was cut")
}

func TestExec_Base64_StreamCarriesExactBytes(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	data := binaryBytes(300<<10, 3) // many reads: chunk borders fall inside broken UTF-8
	writeWorkFile(t, a, "data.bin", data)
	st, err := a.client.ExecStream(ctx, agentapi.ExecRequest{Command: "cat data.bin; cat data.bin >&2; printf '\\342\\202'",
		Encoding: agentapi.EncodingBase64, MaxOutputBytes: 1 << 20})
	require.NoError(t, err)
	defer st.Close()
	out, errOut, res := streamBytes(t, st, agentapi.EncodingBase64)
	assert.True(t, bytes.Equal(append(append([]byte{}, data...), 0xe2, 0x82), out), "stdout: %d bytes, want %d", len(out), len(data)+2)
	assert.True(t, bytes.Equal(data, errOut), "stderr: %d bytes, want %d", len(errOut), len(data))
	assert.False(t, res.Truncated)
	assert.Equal(t, 0, res.ExitCode)
}

// unlimited_output streams everything, past the agent's maximum cap.
func TestExec_UnlimitedOutput_StreamsEverything(t *testing.T) {
	a := newTestAgent(t, func(c *Config) {
		c.DefaultOutputBytes = 1 << 10
		c.MaxOutputBytes = 64 << 10
	})
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	const n = 4 << 20 // 64 times the maximum
	st, err := a.client.ExecStream(ctx, agentapi.ExecRequest{Command: "head -c 4194304 /dev/zero | tr '\\0' '\\377'",
		Encoding: agentapi.EncodingBase64, UnlimitedOutput: true})
	require.NoError(t, err)
	defer st.Close()
	out, _, res := streamBytes(t, st, agentapi.EncodingBase64)
	assert.Len(t, out, n)
	assert.True(t, bytes.Equal(bytes.Repeat([]byte{0xff}, n), out))
	assert.False(t, res.Truncated)
	assert.Equal(t, 0, res.ExitCode)
}

func TestExec_Encoding_BadRequestNamingField(t *testing.T) {
	a := newTestAgent(t, nil)
	ctx := context.Background()
	tests := []struct {
		name   string
		req    agentapi.ExecRequest
		stream bool
		field  string
	}{
		{"unknown encoding", agentapi.ExecRequest{Command: "true", Encoding: "hex"}, false, "encoding: "},
		{"unknown encoding, stream", agentapi.ExecRequest{Command: "true", Encoding: "UTF8"}, true, "encoding: "},
		{"stdin twice", agentapi.ExecRequest{Command: "cat", Stdin: "a", StdinBase64: "YQ=="}, false, "stdin_base64: "},
		{"stdin not base64", agentapi.ExecRequest{Command: "cat", StdinBase64: "not base64!"}, false, "stdin_base64: "},
		{"unlimited in JSON", agentapi.ExecRequest{Command: "true", UnlimitedOutput: true}, false, "unlimited_output: "},
		{"unlimited with a cap", agentapi.ExecRequest{Command: "true", UnlimitedOutput: true, MaxOutputBytes: 10}, true, "unlimited_output: "},
		{"cap over the maximum, stream", agentapi.ExecRequest{Command: "true", MaxOutputBytes: 1 << 40, Encoding: agentapi.EncodingBase64}, true, "max_output_bytes: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			if tt.stream {
				var st *agentapi.EventStream
				st, err = a.client.ExecStream(ctx, tt.req)
				if st != nil {
					st.Close()
				}
			} else {
				_, err = a.client.Exec(ctx, tt.req)
			}
			ae := apiError(t, err)
			assert.Equal(t, http.StatusBadRequest, ae.Status, ae.Message)
			assert.Equal(t, agentapi.CodeBadRequest, ae.Code)
			assert.True(t, strings.HasPrefix(ae.Message, tt.field), "message %q should start with %q", ae.Message, tt.field)
		})
	}
}
