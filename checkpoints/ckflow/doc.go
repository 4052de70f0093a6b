// Package ckflow is the checkpoint workflows: take a sandbox's checkpoint
// (its agent's archive streamed into a checkpoints.Store), restore one
// into a sandbox (the store's reader streamed into its agent), lease a
// sandbox with a checkpoint restored before it is handed out
// (from_checkpoint), and fork a sandbox into N new ones. The gateway's
// checkpoint routes parse, authorize (they read the caller's lease), call
// a Service and render its results; any other surface can do the same.
//
// Neither direction holds an archive whole: what is buffered is the
// agent client's and the store's copy buffers.
//
// Files: service.go is the Service, its Config and Deps, the interfaces
// it needs of its caller (Leases: the warm pool side; Sandboxes and Agent:
// a lease's agent; Metrics) and the store reads (Get, List, Delete);
// take.go takes a checkpoint (Take, CheckTake); restore.go resolves and
// restores one (Resolve, Restore, AcquireRestored); fork.go is Fork;
// layer.go decides when sandboxes made from a checkpoint start on its
// copy-on-write layer instead (Config.CowMinBytes, Leases.PrepareLayer).
//
// It imports the contracts it works over (checkpoints, warmpool's lease
// types, providers.ErrNoLayer, execagent/agentapi's checkpoint types), internal/badinput and
// internal/clock. It must not import the gateway, fiber, api (the wire
// types are the caller's to render), errclass (the caller
// classifies), a concrete store (checkpoints/filestore, s3store) or a
// provider; its tests use the embedded store.
package ckflow
