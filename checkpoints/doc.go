// Package checkpoints is the checkpoint-store contract: a checkpoint is one
// tar archive (agentapi.FormatTar, or FormatTarGzip) of a sandbox's paths, taken by its agent, with its
// metadata (Checkpoint), kept for its owner (an API key) until it is
// deleted or it expires. Store is the interface the gateway uses to keep
// them. The package also holds what every store shares: the sentinel
// errors, ids (NewID, ValidID), the argument checks (CheckPut,
// Filter.Check), List's order (Newer), the readers a Put copies through
// (DigestReader) and an Open returns (VerifyReader), the budget's rules
// and checks (budget.go: Budget, Usage, BudgetError; Budget.Reader stops a
// Put where the budget ends), and Config (QUARRY_CHECKPOINT_*).
//
// Backends are subpackages: filestore (embedded: content-addressed files
// and bbolt under QUARRY_DATA_DIR) and s3store (objects in S3, metadata in
// DynamoDB). checkpointtest is the conformance suite both pass. ckflow is
// not a backend: it is the workflows (take, restore, fork) over a Store
// that the gateway's checkpoint routes call.
//
// Refinements of the contract as first written (issue 14's common
// context), with their reasons:
//   - The caller sets CreatedAt and ExpiresAt (it knows the retention); the
//     store sets only SHA256 and SizeBytes. Get needs the time to hide an
//     expired checkpoint, so stores take a clock (internal/clock).
//   - Delete of an unknown id is nil: after a Delete the id is unknown, so
//     an idempotent Delete cannot tell the two apart.
//   - Purge counts every item it removes; in s3store that includes uploads
//     abandoned by a crashed gateway, past their grace.
//   - A store keeps a budget (issue "a newcomer's first hour": a 512 MiB
//     work dir at compression none was a 537 MB blob, and nothing bounded
//     how many): Put refuses past it with a *BudgetError, and Usage reads
//     the counts, which each store keeps with its checkpoints in the
//     commits that change them, so that they are exact under races and
//     survive a restart.
//
// It must not import any other Quarry package but internal/badinput and
// internal/defaults: the gateway, the stores and the suite import it.
package checkpoints
