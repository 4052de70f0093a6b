package api

import "time"

// PrefetchRequest is the body of POST /v1/images/prefetch: images the
// next acquires will ask for, with the class and resources they will ask
// with (as in CreateSandboxRequest).
type PrefetchRequest struct {
	Images []string `json:"images"`
	Class  string   `json:"class,omitempty"`
	CPU    float64  `json:"cpu,omitempty"`
	Memory MiB      `json:"memory,omitempty"`
	Disk   MiB      `json:"disk,omitempty"`
	// Warm ready sandboxes are kept for each image until its class's warm
	// window has passed.
	Warm int `json:"warm,omitempty"`
}

// Prefetch states (PrefetchedImage.State).
const (
	PrefetchQueued  = "queued"  // its preparation (a pull, a task definition) runs in the background
	PrefetchReady   = "ready"   // its pool is there already
	PrefetchRefused = "refused" // not accepted: Error says why
)

// PrefetchedImage is one image of a prefetch's answer.
type PrefetchedImage struct {
	Image string `json:"image"`
	// Ref is the image's normalized reference (docker.io/library/python:3.11),
	// as GET /v1/images names it; Pool its on-demand pool.
	Ref   string     `json:"ref,omitempty"`
	Pool  string     `json:"pool,omitempty"`
	State string     `json:"state"`
	Error *ForkError `json:"error,omitempty"` // the status, code and message an acquire of it would get
}

// PrefetchResponse is the answer (202) of POST /v1/images/prefetch, one
// entry per image asked for, in order.
type PrefetchResponse struct {
	Images []PrefetchedImage `json:"images"`
}

// Image states (Image.State): on the provider.
const (
	ImagePulling = "pulling"
	ImageReady   = "ready"
	ImageFailed  = "failed"
)

// Image is one image of an on-demand pool, or one a provider is preparing
// or failed to prepare (GET /v1/images).
type Image struct {
	Image     string  `json:"image"`
	Class     string  `json:"class,omitempty"`
	Pool      string  `json:"pool,omitempty"` // absent while no pool holds it (its first preparation)
	CPU       float64 `json:"cpu,omitempty"`
	MemoryMiB int     `json:"memory_mib,omitempty"`
	DiskMiB   int     `json:"disk_mib,omitempty"`
	// PoolState is "active" or "ended" (absent without a pool).
	PoolState string `json:"pool_state,omitempty"`
	// State is ImagePulling (with BytesDone and BytesTotal when the
	// provider reports them), ImageReady or ImageFailed (with Reason).
	State      string    `json:"state"`
	Reason     string    `json:"reason,omitempty"`
	BytesDone  int64     `json:"bytes_done,omitempty"`
	BytesTotal int64     `json:"bytes_total,omitempty"`
	SizeBytes  int64     `json:"size_bytes,omitempty"`
	Digest     string    `json:"digest,omitempty"`
	CreatedAt  time.Time `json:"created_at,omitzero"`
	LastUsed   time.Time `json:"last_used,omitzero"`
	Acquires   int64     `json:"acquires,omitempty"`
	// Warm is how many ready sandboxes its pool keeps now (this gateway's
	// view).
	Warm int `json:"warm,omitempty"`
}

// ImageList is the answer of GET /v1/images: a page, and the cursor of the
// next (Next, also sent as the next request's ?cursor=).
type ImageList struct {
	Images []Image `json:"images"`
	Next   string  `json:"next,omitempty"`
}

// BuildEvent is one line of POST /v1/images/build's answer
// (application/x-ndjson): Log lines of the build as they come, then one
// line with Image (the reference to create sandboxes from) or Error.
type BuildEvent struct {
	Log       string     `json:"log,omitempty"`
	Image     string     `json:"image,omitempty"`
	Digest    string     `json:"digest,omitempty"`
	SizeBytes int64      `json:"size_bytes,omitempty"`
	Error     *ForkError `json:"error,omitempty"`
}

// Class is one pool class of on-demand pools (GET /v1/pools, classes).
type Class struct {
	Name         string   `json:"name"`
	Provider     string   `json:"provider"`
	Images       []string `json:"images"`
	CPU          float64  `json:"cpu"`
	MemoryMiB    int      `json:"memory_mib"`
	DiskMiB      int      `json:"disk_mib,omitempty"`
	MaxCPU       float64  `json:"max_cpu"`
	MaxMemoryMiB int      `json:"max_memory_mib"`
	MaxDiskMiB   int      `json:"max_disk_mib,omitempty"`
	MaxTotal     int      `json:"max_total"`
	MaxPerImage  int      `json:"max_per_image"`
	Tasks        int      `json:"tasks"`
}
