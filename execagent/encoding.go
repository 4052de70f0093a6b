package execagent

import (
	"encoding/base64"
	"math"

	"github.com/quarryhq/quarry/execagent/agentapi"
)

// execStdin returns the stdin of an exec request, from Stdin (text) or
// StdinBase64 (bytes); nil means /dev/null.
func execStdin(req agentapi.ExecRequest) ([]byte, error) {
	switch {
	case req.Stdin != "" && req.StdinBase64 != "":
		return nil, invalid("stdin_base64", "set either stdin or stdin_base64, not both")
	case req.StdinBase64 != "":
		b, err := base64.StdEncoding.DecodeString(req.StdinBase64)
		if err != nil {
			return nil, invalid("stdin_base64", "not standard base64 (RFC 4648, padded): %s", err.Error())
		}
		return b, nil
	case req.Stdin != "":
		return []byte(req.Stdin), nil
	}
	return nil, nil
}

// outputEncoding validates an exec request's encoding: EncodingUTF8 (also
// "") or EncodingBase64.
func outputEncoding(enc string) (string, error) {
	switch enc {
	case "", agentapi.EncodingUTF8:
		return agentapi.EncodingUTF8, nil
	case agentapi.EncodingBase64:
		return enc, nil
	}
	return "", invalid("encoding", "must be %q (the default) or %q, got %q", agentapi.EncodingUTF8, agentapi.EncodingBase64, enc)
}

// noOutputLimit is the output cap of a stream with UnlimitedOutput.
const noOutputLimit = math.MaxInt64

// streamLimit applies an exec request's UnlimitedOutput to its output cap
// limit: allowed only on a stream and without max_output_bytes.
func streamLimit(req agentapi.ExecRequest, stream bool, limit int64) (int64, error) {
	switch {
	case !req.UnlimitedOutput:
		return limit, nil
	case !stream:
		return 0, invalid("unlimited_output", "only for a streaming exec (Accept: text/event-stream): a JSON answer is held whole, bounded by max_output_bytes")
	case req.MaxOutputBytes != 0:
		return 0, invalid("unlimited_output", "set either unlimited_output or max_output_bytes, not both")
	}
	return noOutputLimit, nil
}
