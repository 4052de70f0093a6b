package agentapi

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSSEReader_Next(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		max      int
		want     []Event
		err      error
		comments int
	}{
		{
			name: "events and keep-alives",
			in:   ": keep-alive\n\nevent: stdout\ndata: {\"data\":\"a\"}\n\n: keep-alive\n\nevent: exit\ndata: {}\n\n",
			want: []Event{{Name: "stdout", Data: []byte(`{"data":"a"}`)}, {Name: "exit", Data: []byte(`{}`)}},
			err:  io.EOF, comments: 2,
		},
		{
			name: "multi-line data and default name",
			in:   "data: one\ndata: two\n\n",
			want: []Event{{Name: "message", Data: []byte("one\ntwo")}},
			err:  io.EOF,
		},
		{
			name: "CRLF and no space after colon",
			in:   "event:output\r\ndata:x\r\n\r\n",
			want: []Event{{Name: "output", Data: []byte("x")}},
			err:  io.EOF,
		},
		{
			name: "blank lines without data are skipped",
			in:   "\n\nevent: ignored\n\ndata: d\n\n",
			want: []Event{{Name: "message", Data: []byte("d")}},
			err:  io.EOF,
		},
		{
			name: "event cut off",
			in:   "event: exit\ndata: {",
			err:  io.ErrUnexpectedEOF,
		},
		{
			name: "event too large",
			in:   "data: " + strings.Repeat("x", 100) + "\n\n",
			max:  50,
			err:  ErrEventTooLarge,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewSSEReader(strings.NewReader(tt.in), tt.max)
			var got []Event
			var err error
			for {
				var ev Event
				ev, err = r.Next()
				if err != nil {
					break
				}
				got = append(got, Event{Name: ev.Name, Data: append([]byte(nil), ev.Data...)})
			}
			assert.Equal(t, tt.want, got)
			assert.True(t, errors.Is(err, tt.err), "error %v, want %v", err, tt.err)
			assert.Equal(t, tt.comments, r.Comments())
		})
	}
}

func TestEvent_Decode(t *testing.T) {
	var c StreamChunk
	require.NoError(t, Event{Name: EventOutput, Data: []byte(`{"data":"hi","offset":3}`)}.Decode(&c))
	assert.Equal(t, StreamChunk{Data: "hi", Offset: 3}, c)
	err := Event{Name: EventExit, Data: []byte(`{`)}.Decode(&c)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "exit event")
}

func TestFormatMode(t *testing.T) {
	assert.Equal(t, "0644", FormatMode(0o644))
	assert.Equal(t, "0755", FormatMode(0o755|1<<31))
}
