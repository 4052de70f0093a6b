package api

import (
	"encoding/json"
	"time"
)

// The bodies of the model relay pass through the gateway byte for byte:
// the gateway writes each one into the JSON verbatim when it is JSON and
// as a JSON string otherwise, after encoding the rest of the type with the
// body field left empty (json.Marshal would compact a json.RawMessage and
// escape HTML in it). Decoders find the body, exactly as sent, in the
// json.RawMessage.

// ModelRequest describes one call an agent made to its sandbox's relay.
type ModelRequest struct {
	ID         string            `json:"id"`
	SandboxID  string            `json:"sandbox_id"`
	Pool       string            `json:"pool"`
	Labels     map[string]string `json:"labels"` // {} when the lease has none
	Route      string            `json:"route"`  // "chat/completions" or "completions"
	Stream     bool              `json:"stream"`
	Attempt    int               `json:"attempt"` // claims so far, this one included
	ReceivedAt time.Time         `json:"received_at"`
	Deadline   time.Time         `json:"deadline"`
}

// ClaimedRequest is a request as a trainer claims it: its description and
// the agent's body.
type ClaimedRequest struct {
	ModelRequest
	Body json.RawMessage `json:"body,omitempty"`
}

// ClaimedRequests is the answer of GET /v1/model/requests.
type ClaimedRequests struct {
	Requests []ClaimedRequest `json:"requests"`
}

// Exchange is one entry of a sandbox's relay transcript: a request and
// how it ended.
type Exchange struct {
	ModelRequest
	State     string    `json:"state"` // pending, claimed, answered, cancelled, expired or failed
	Reason    string    `json:"reason,omitempty"`
	Upstream  string    `json:"upstream,omitempty"` // the passthrough URL that answered
	ClaimedAt time.Time `json:"claimed_at,omitzero"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	LatencyMS *int64    `json:"latency_ms,omitempty"` // EndedAt - ReceivedAt, once ended
	Truncated bool      `json:"truncated,omitempty"`  // the transcript kept only the start of the answer
	// Request is the agent's body.
	Request  json.RawMessage   `json:"request,omitempty"`
	Response *ExchangeResponse `json:"response,omitempty"`
}

// ExchangeResponse is the answer of an Exchange.
type ExchangeResponse struct {
	Status      int             `json:"status"`
	ContentType string          `json:"content_type"`
	AnsweredAt  time.Time       `json:"answered_at"`
	Body        json.RawMessage `json:"body,omitempty"`
}

// Transcript is the answer of GET /v1/sandboxes/{id}/model/transcript: a
// page of exchanges, oldest first. NextAfter, when set, is the after= of
// the next page.
type Transcript struct {
	SandboxID string     `json:"sandbox_id"`
	Exchanges []Exchange `json:"exchanges"`
	NextAfter string     `json:"next_after,omitempty"`
}
