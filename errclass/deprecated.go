package errclass

import "github.com/quarryhq/quarry/api"

// Deprecated names of api's codes. Quarry's codes are api's (api.Codes());
// these stay only until gateway's tests, which another change is editing,
// name api's.
const (
	// Deprecated: use api.CodeMethodNotAllowed.
	CodeMethodNotAllowed = api.CodeMethodNotAllowed
	// Deprecated: use api.CodeUpstreamUnreachable.
	CodeUpstreamUnreachable = api.CodeUpstreamUnreachable
	// Deprecated: use api.CodeCheckpointCorrupt.
	CodeCheckpointCorrupt = api.CodeCheckpointCorrupt
	// Deprecated: use api.CodeQuotaExceeded.
	CodeQuotaExceeded = api.CodeQuotaExceeded
)
