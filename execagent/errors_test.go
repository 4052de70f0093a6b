package execagent

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// The agent's answers pass through the gateway as they are: no message
// ends in white space, even one that quotes a command's output.
func TestClassify_MessageNeverEndsInWhiteSpace(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{name: "an answer with its status", err: statusError(errConflict, http.StatusConflict, agentapi.CodeProcessExited, "process p-1 has exited (exit code 1); stderr tail: %s", "boom\n"),
			want: "process p-1 has exited (exit code 1); stderr tail: boom"},
		{name: "bad input", err: invalid("command", "%s", "ends in a newline\n"), want: "command: ends in a newline"},
		{name: "internal", err: fmt.Errorf("start command: %s", "no\r\n"), want: "start command: no"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, msg := classify(tc.err)
			assert.Equal(t, tc.want, msg)
		})
	}
}
