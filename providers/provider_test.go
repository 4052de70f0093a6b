package providers

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheckNames(t *testing.T) {
	spec := Spec{Pool: "p", Image: "img"}
	noDots := func(n string) error {
		if n == "" || n[0] == '.' {
			return errors.New("bad start")
		}
		return nil
	}
	tests := []struct {
		name  string
		names []string
		want  string
	}{
		{name: "fine", names: []string{"a", "b"}},
		{name: "none", names: nil},
		{name: "invalid", names: []string{"a", ".b"}, want: `names[1] ".b": bad start`},
		{name: "repeated", names: []string{"a", "b", "a"}, want: `names[2] "a": repeated`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckNames(spec, tt.names, noDots)
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalidSpec)
			var le *LaunchError
			require.ErrorAs(t, err, &le)
			assert.Equal(t, "p", le.Pool)
			assert.Contains(t, le.Reason, tt.want)
		})
	}
}

func TestCheckEnv(t *testing.T) {
	tests := []struct {
		name        string
		env         map[string]string
		wantKey     string
		wantProblem string
	}{
		{name: "fine", env: map[string]string{"A": "1", "PATH": "/bin"}},
		{name: "empty name", env: map[string]string{"": "x"}, wantKey: "", wantProblem: "not a valid variable name"},
		{name: "equals in name", env: map[string]string{"A=B": "x"}, wantKey: "A=B", wantProblem: "not a valid variable name"},
		{name: "agent's own", env: map[string]string{"QUARRY_AGENT_TOKEN": "x"}, wantKey: "QUARRY_AGENT_TOKEN", wantProblem: "reserved for the agent"},
		{name: "NUL in value", env: map[string]string{"B": "a\x00b"}, wantKey: "B", wantProblem: "NUL byte"},
		{name: "first in sorted order", env: map[string]string{"Z=": "x", "A=": "y"}, wantKey: "A=", wantProblem: "not a valid variable name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, problem := CheckEnv(tt.env)
			assert.Equal(t, tt.wantKey, k)
			if tt.wantProblem == "" {
				assert.Empty(t, problem)
				return
			}
			assert.Contains(t, problem, tt.wantProblem)
		})
	}
}

func TestAgentLogTail(t *testing.T) {
	crash := `{"level":"INFO","msg":"exec agent listening"}
{"level":"INFO","msg":"init","lease":"sbx-1"}
runtime: failed to create new OS thread (have 7 already; errno=11)
runtime: may need to increase max user processes (ulimit -u)
fatal error: newosproc

runtime stack:
runtime.throw({0x83a0f8?, 0x349d1d7f1d88?})
	/usr/local/go/src/runtime/panic.go:1101 +0x48

goroutine 1 gp=0xc000002380 m=nil [IO wait]:
runtime.gopark(0x0?, 0x0?, 0x0?, 0x0?, 0x0?)
`
	tests := []struct {
		name, log, want string
	}{
		{name: "empty", log: "", want: ""},
		{name: "blank", log: "\n \n", want: ""},
		{name: "the last lines", log: "1\n2\n3\n4\n5\n6\n7\n8\n",
			want: "; its log ends: 3 | 4 | 5 | 6 | 7 | 8"},
		{name: "a Go crash without its stack dump", log: crash,
			want: `; its log ends: {"level":"INFO","msg":"exec agent listening"} | {"level":"INFO","msg":"init","lease":"sbx-1"} | ` +
				"runtime: failed to create new OS thread (have 7 already; errno=11) | runtime: may need to increase max user processes (ulimit -u) | fatal error: newosproc"},
		{name: "a panic", log: "starting\npanic: boom\n\ngoroutine 1 [running]:\nmain.main()\n", want: "; its log ends: starting | panic: boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, AgentLogTail(tt.log))
		})
	}
	long := AgentLogTail(strings.Repeat("é", 4000))
	assert.LessOrEqual(t, len(long), len("; its log ends: …")+1024)
	assert.True(t, utf8.ValidString(long), "cut at a character boundary")
}
