package client

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"

	"github.com/quarryhq/quarry/api"
)

// The checkpoint wire types (package api), named for the client's callers.
type (
	// Checkpoint is one checkpoint of a sandbox's paths.
	Checkpoint = api.Checkpoint
	// CreateCheckpointRequest names the paths of a checkpoint (none: the
	// work dir), the patterns to leave out, and its labels.
	CreateCheckpointRequest = api.CreateCheckpointRequest
	// RestoreResult is the answer of RestoreSandbox.
	RestoreResult = api.RestoreResult
	// ForkRequest asks for Count sandboxes forked from one.
	ForkRequest = api.ForkRequest
	// ForkResult is the checkpoint a fork took and one result per fork.
	ForkResult = api.ForkResult
	// Fork is one fork's sandbox or error.
	Fork = api.Fork
)

// checkpointRoute is /v1/checkpoints/{id}.
func checkpointRoute(id string) route {
	if id == "" {
		return route{err: errors.New("checkpoint id: must not be empty")}
	}
	return route{path: "/v1/checkpoints/" + url.PathEscape(id)}
}

// CreateCheckpoint takes a checkpoint of a sandbox's paths (POST
// /v1/sandboxes/{id}/checkpoints). An archive over the gateway's limit is
// a 413 (IsTooLarge), a missing path a 404.
func (c *Client) CreateCheckpoint(ctx context.Context, sandboxID string, req CreateCheckpointRequest) (Checkpoint, error) {
	var ck Checkpoint
	err := c.do(ctx, call{method: http.MethodPost, route: sandboxRoute(sandboxID, "checkpoints"), in: req}, &ck)
	return ck, err
}

// ListCheckpoints returns the caller's checkpoints carrying every label of
// labels, newest first, at most limit (0: the gateway's default, 100)
// (GET /v1/checkpoints).
func (c *Client) ListCheckpoints(ctx context.Context, labels map[string]string, limit int) ([]Checkpoint, error) {
	q := url.Values{}
	addLabels(q, labels)
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out api.CheckpointList
	err := c.do(ctx, call{method: http.MethodGet, route: route{path: "/v1/checkpoints"}, query: q}, &out)
	return out.Checkpoints, err
}

// GetCheckpoint returns one of the caller's checkpoints; an unknown,
// expired or another key's is a 404 (IsNotFound).
func (c *Client) GetCheckpoint(ctx context.Context, id string) (Checkpoint, error) {
	var ck Checkpoint
	err := c.do(ctx, call{method: http.MethodGet, route: checkpointRoute(id)}, &ck)
	return ck, err
}

// DeleteCheckpoint deletes one of the caller's checkpoints; deleting it
// again is nil.
func (c *Client) DeleteCheckpoint(ctx context.Context, id string) error {
	return c.do(ctx, call{method: http.MethodDelete, route: checkpointRoute(id)}, nil)
}

// RestoreSandbox rolls a sandbox's paths back to a checkpoint, in place
// (POST /v1/sandboxes/{id}/restore). A checkpoint of another image is a
// 400; another restore running in the sandbox a 409 (IsBusy); a failure
// leaves the sandbox as it was.
func (c *Client) RestoreSandbox(ctx context.Context, sandboxID, checkpointID string) (RestoreResult, error) {
	var res RestoreResult
	err := c.do(ctx, call{method: http.MethodPost, route: sandboxRoute(sandboxID, "restore"),
		in: api.RestoreRequest{Checkpoint: checkpointID}}, &res)
	return res, err
}

// ForkSandbox takes a checkpoint of a sandbox and makes req.Count
// sandboxes with it restored (POST /v1/sandboxes/{id}/fork). The call
// succeeds when the checkpoint was taken; each fork's result is its
// sandbox or its own error (a fork past the pool's room: status 503, code
// no_capacity).
func (c *Client) ForkSandbox(ctx context.Context, sandboxID string, req ForkRequest) (ForkResult, error) {
	var res ForkResult
	err := c.do(ctx, call{method: http.MethodPost, route: sandboxRoute(sandboxID, "fork"), in: req}, &res)
	return res, err
}
