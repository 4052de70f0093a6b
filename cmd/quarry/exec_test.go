package main

import (
	"encoding/base64"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

func TestRun_SandboxExec_OutputByteForByte(t *testing.T) {
	f := newFakeGateway(t)
	f.mustCreate(t)
	f.exec = func(w sseWriter, _ agentapi.ExecRequest) {
		w.event(agentapi.EventStdout, agentapi.StreamChunk{Data: "\x00\x01\xff"})
		w.event(agentapi.EventStderr, agentapi.StreamChunk{Data: "\xe2\x82"}) // half a character
		w.event(agentapi.EventStdout, agentapi.StreamChunk{Data: "\xac"})
		w.event(agentapi.EventExit, agentapi.ExecResult{})
	}
	res := f.cli(t, "", "sandbox", "exec", "sbx-1", `printf '\x00\x01\xff'`)
	assert.Equal(t, result{"\x00\x01\xff\xac", "\xe2\x82", 0}, res)
	require.Len(t, f.execs, 1)
	assert.Equal(t, agentapi.EncodingBase64, f.execs[0].Encoding)
	assert.True(t, f.execs[0].UnlimitedOutput, "without --max-output all the output is streamed")
	assert.Zero(t, f.execs[0].MaxOutputBytes)
}

func TestRun_SandboxExec_BinaryStdinSentExactly(t *testing.T) {
	f := newFakeGateway(t)
	f.mustCreate(t)
	in := "\x00\x01\xff\xfe text"
	res := f.cli(t, in, "sandbox", "exec", "-i", "sbx-1", "cat")
	require.Equal(t, 0, res.code, res.stderr)
	require.Len(t, f.execs, 1)
	assert.Empty(t, f.execs[0].Stdin)
	assert.Equal(t, base64.StdEncoding.EncodeToString([]byte(in)), f.execs[0].StdinBase64)
}

func TestRun_SandboxExec_MaxOutput(t *testing.T) {
	tests := []struct {
		name    string
		args    []string // after "sandbox exec"
		exit    agentapi.ExecResult
		want    result
		wantMax int64
	}{
		{
			name:    "cut output of a command that succeeded fails with its own status",
			args:    []string{"--max-output", "64Mi", "sbx-1", "yes"},
			exit:    agentapi.ExecResult{Truncated: true},
			want:    result{"y\n", "quarry: output over --max-output 67108864 bytes: the rest was discarded (raise --max-output, or leave it out to stream all of it)\n", exitOutputCut},
			wantMax: 64 << 20,
		},
		{
			name:    "a failed command's status wins",
			args:    []string{"sbx-1", "--max-output", "100", "yes; exit 7"},
			exit:    agentapi.ExecResult{ExitCode: 7, Truncated: true},
			want:    result{"y\n", "quarry: output over --max-output 100 bytes: the rest was discarded (raise --max-output, or leave it out to stream all of it)\n", 7},
			wantMax: 100,
		},
		{
			name:    "timed out and cut",
			args:    []string{"--max-output", "1k", "sbx-1", "yes"},
			exit:    agentapi.ExecResult{ExitCode: -1, Signal: "SIGKILL", TimedOut: true, Truncated: true},
			want:    result{"y\n", "quarry: command timed out\nquarry: output over --max-output 1024 bytes: the rest was discarded (raise --max-output, or leave it out to stream all of it)\n", 137},
			wantMax: 1 << 10,
		},
		{
			name:    "under the cap",
			args:    []string{"--max-output", "2G", "sbx-1", "yes"},
			exit:    agentapi.ExecResult{},
			want:    result{"y\n", "", 0},
			wantMax: 2 << 30,
		},
		{
			name: "cut by the agent without --max-output",
			args: []string{"sbx-1", "yes"},
			exit: agentapi.ExecResult{Truncated: true},
			want: result{"y\n", "quarry: output over the sandbox agent's cap: the rest was discarded\n", exitOutputCut},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeGateway(t)
			f.mustCreate(t)
			f.exec = func(w sseWriter, _ agentapi.ExecRequest) {
				w.event(agentapi.EventStdout, agentapi.StreamChunk{Data: "y\n"})
				w.event(agentapi.EventExit, tt.exit)
			}
			res := f.cli(t, "", append([]string{"sandbox", "exec"}, tt.args...)...)
			assert.Equal(t, tt.want, res)
			require.Len(t, f.execs, 1)
			assert.Equal(t, tt.wantMax, f.execs[0].MaxOutputBytes)
			assert.Equal(t, tt.wantMax == 0, f.execs[0].UnlimitedOutput)
		})
	}
}

func TestRun_SandboxExec_MaxOutputBadSize(t *testing.T) {
	for _, v := range []string{"x", "-1", "1.5G", "64Xi", "Mi", "9999999999G"} {
		t.Run(v, func(t *testing.T) {
			f := newFakeGateway(t)
			f.mustCreate(t)
			res := f.cli(t, "", "sandbox", "exec", "--max-output", v, "sbx-1", "true")
			assert.Equal(t, 1, res.code)
			assert.Contains(t, res.stderr, "-max-output")
			assert.Empty(t, f.execs)
		})
	}
}

func TestSizeFlag_Set(t *testing.T) {
	tests := []struct {
		in   string
		want int64
	}{
		{"0", 0}, {"1048576", 1 << 20}, {"100b", 100}, {"512k", 512 << 10}, {"512KiB", 512 << 10},
		{"64Mi", 64 << 20}, {"64M", 64 << 20}, {"64MB", 64 << 20}, {"1G", 1 << 30}, {"1gi", 1 << 30},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			var s sizeFlag
			require.NoError(t, s.Set(tt.in))
			assert.Equal(t, tt.want, int64(s))
		})
	}
}
