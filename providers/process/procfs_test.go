package process

import (
	"context"
	"io/fs"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// statLine builds a /proc/<pid>/stat line with the given name, state,
// session and start time (other fields are plausible constants).
func statLine(pid, name, state, session, start string) string {
	return pid + " (" + name + ") " + state + " 1 " + pid + " " + session +
		" 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 " + start + " 1000 200 18446744073709551615"
}

func TestParseStat(t *testing.T) {
	tests := []struct {
		name    string
		line    string
		want    procStat
		wantErr bool
	}{
		{name: "plain", line: statLine("42", "bash", "S", "40", "12345"),
			want: procStat{PID: 42, State: 'S', Session: 40, StartTime: 12345}},
		{name: "name with spaces and parens", line: statLine("7", "a) (b c", "R", "7", "99"),
			want: procStat{PID: 7, State: 'R', Session: 7, StartTime: 99}},
		{name: "zombie", line: statLine("8", "sleep", "Z", "3", "5"),
			want: procStat{PID: 8, State: 'Z', Session: 3, StartTime: 5}},
		{name: "no name", line: "42 S 1 2 3", wantErr: true},
		{name: "too few fields", line: "42 (x) S 1 2 3", wantErr: true},
		{name: "bad session", line: statLine("42", "x", "S", "abc", "1"), wantErr: true},
		{name: "bad start time", line: statLine("42", "x", "S", "1", "-1"), wantErr: true},
		{name: "bad pid", line: statLine("x", "x", "S", "1", "1"), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStat([]byte(tt.line))
			if tt.wantErr {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestProcStat_Dead(t *testing.T) {
	tests := []struct {
		state byte
		dead  bool
	}{{'R', false}, {'S', false}, {'D', false}, {'T', false}, {'Z', true}, {'X', true}}
	for _, tt := range tests {
		t.Run(string(tt.state), func(t *testing.T) {
			assert.Equal(t, tt.dead, procStat{State: tt.state}.dead())
		})
	}
}

func TestReadStat_ThisProcessAndMissingOne(t *testing.T) {
	st, err := readStat(os.Getpid())
	require.NoError(t, err)
	assert.Equal(t, os.Getpid(), st.PID)
	assert.NotZero(t, st.StartTime)
	assert.False(t, st.dead())

	_, err = readStat(1 << 30) // above pid_max
	assert.ErrorIs(t, err, fs.ErrNotExist)
}

func TestSessionMembers_FindsThisProcess(t *testing.T) {
	st, err := readStat(os.Getpid())
	require.NoError(t, err)
	var s sessionScanner
	pids, err := s.members(context.Background(), st.Session)
	require.NoError(t, err)
	assert.Contains(t, pids, os.Getpid())
}
