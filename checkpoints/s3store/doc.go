// Package s3store is the checkpoint store for many gateway replicas:
// checkpoints.Store with archives as S3 objects and metadata in one
// DynamoDB table next to the lease store's (docs/ARCHITECTURE.md, "S3 +
// DynamoDB", has the table design and the calls of each operation).
//
// A Put reserves the id with a pending item, streams the archive through
// a checkpoints.DigestReader into the SDK's transfer manager (multipart
// parts of Config.PartSize, Config.UploadConcurrency in flight: memory is
// bounded whatever the archive's size) under a key of its own, and makes
// the item ready, with its sha256 and size, in one conditional write only
// after the object is complete. Every removal moves the item to deleting
// first, then deletes the object, then the item, so no ready item points
// at a missing object; Purge finishes what a crash left.
//
// The budget (usage.go): two counter items in the same table, the owner's
// and the total, change in the transactions that make an item ready (on
// the condition that neither passes its limit) and that delete a deleting
// one (taking away what the item counted). A commit whose answer was lost
// is read back before anything is abandoned. Checkpoints made before the
// budget count nothing until they expire.
//
// It passes checkpoints/checkpointtest against the AWS emulator. It must
// not import the gateway, the warm pool, the providers or another store.
package s3store
