package checkpoints

import (
	"maps"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/quarryhq/quarry/internal/badinput"
)

// Limits of the metadata every store accepts (CheckPut): they keep one
// record far below DynamoDB's 400 KB item, whatever the backend.
const (
	MaxPaths         = 64
	MaxPathLen       = 4096
	MaxExcludes      = 256
	MaxExcludeLen    = 1024
	MaxLabels        = 64
	MaxLabelKeyLen   = 128
	MaxLabelValueLen = 256
	maxNameLen       = 256 // owner, pool, image, sandbox, format
)

// CheckPut checks the arguments of Put before a store reads anything, and
// returns meta normalized as every store keeps it: times in UTC without a
// monotonic reading, empty Exclude and Labels as nil, SHA256 and SizeBytes
// cleared (the store computes them). Refused metadata is a
// *badinput.Error naming the field; maxBytes must be positive.
func CheckPut(meta Checkpoint, maxBytes int64) (Checkpoint, error) {
	if !ValidID(meta.ID) {
		return Checkpoint{}, badinput.New("id", "%q is not a checkpoint id (%s and 26 base32 characters: NewID)", meta.ID, IDPrefix)
	}
	if maxBytes <= 0 {
		return Checkpoint{}, badinput.New("max_bytes", "must be positive, got %d", maxBytes)
	}
	for _, f := range []struct {
		field, v string
		required bool
	}{
		{"owner", meta.Owner, true}, {"format", meta.Format, true},
		{"pool", meta.Pool, false}, {"image", meta.Image, false}, {"sandbox", meta.Sandbox, false},
	} {
		if f.required && f.v == "" {
			return Checkpoint{}, badinput.New(f.field, "is required")
		}
		if len(f.v) > maxNameLen || !badinput.Printable(f.v) {
			return Checkpoint{}, badinput.New(f.field, "must be at most %d printable ASCII characters", maxNameLen)
		}
	}
	if err := checkPaths(meta.Paths, meta.Exclude); err != nil {
		return Checkpoint{}, err
	}
	if err := checkLabels(meta.Labels); err != nil {
		return Checkpoint{}, err
	}
	if meta.Files < 0 {
		return Checkpoint{}, badinput.New("files", "must not be negative, got %d", meta.Files)
	}
	if meta.CreatedAt.UnixNano() <= 0 {
		return Checkpoint{}, badinput.New("created_at", "must be set (after 1970), got %s", meta.CreatedAt)
	}
	if !meta.ExpiresAt.After(meta.CreatedAt) {
		return Checkpoint{}, badinput.New("expires_at", "must be after created_at (%s), got %s", meta.CreatedAt, meta.ExpiresAt)
	}
	meta.Paths = slices.Clone(meta.Paths)
	meta.Exclude = slices.Clone(meta.Exclude)
	if len(meta.Exclude) == 0 {
		meta.Exclude = nil
	}
	meta.Labels = maps.Clone(meta.Labels)
	if len(meta.Labels) == 0 {
		meta.Labels = nil
	}
	meta.CreatedAt = utc(meta.CreatedAt)
	meta.ExpiresAt = utc(meta.ExpiresAt)
	meta.SHA256, meta.SizeBytes = "", 0
	return meta, nil
}

// utc returns t in UTC without its monotonic reading, as it reads back from
// JSON.
func utc(t time.Time) time.Time { return t.UTC().Round(0) }

func checkPaths(paths, exclude []string) error {
	if len(paths) == 0 || len(paths) > MaxPaths {
		return badinput.New("paths", "give 1 to %d paths, got %d", MaxPaths, len(paths))
	}
	for i, p := range paths {
		if len(p) > MaxPathLen || !strings.HasPrefix(p, "/") || path.Clean(p) != p || strings.ContainsRune(p, 0) {
			return badinput.New("paths", "path %d (%q) must be absolute and clean, at most %d bytes", i, p, MaxPathLen)
		}
	}
	if len(exclude) > MaxExcludes {
		return badinput.New("exclude", "at most %d patterns, got %d", MaxExcludes, len(exclude))
	}
	for i, e := range exclude {
		if e == "" || len(e) > MaxExcludeLen || strings.ContainsRune(e, 0) {
			return badinput.New("exclude", "pattern %d must be 1 to %d bytes without NUL", i, MaxExcludeLen)
		}
	}
	return nil
}

func checkLabels(labels map[string]string) error {
	if len(labels) > MaxLabels {
		return badinput.New("labels", "at most %d labels, got %d", MaxLabels, len(labels))
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if k == "" || len(k) > MaxLabelKeyLen || !badinput.Printable(k) || strings.Contains(k, "=") {
			return badinput.New("labels", "key %q must be 1 to %d printable ASCII characters without '='", k, MaxLabelKeyLen)
		}
		if v := labels[k]; len(v) > MaxLabelValueLen || !badinput.Printable(v) {
			return badinput.New("labels."+k, "must be at most %d printable ASCII characters", MaxLabelValueLen)
		}
	}
	return nil
}

// Check returns f with its limit resolved (DefaultListLimit for 0 or less,
// at most MaxListLimit), or a *badinput.Error when it has no owner.
func (f Filter) Check() (Filter, error) {
	if f.Owner == "" {
		return Filter{}, badinput.New("owner", "is required: List never crosses owners")
	}
	switch {
	case f.Limit <= 0:
		f.Limit = DefaultListLimit
	case f.Limit > MaxListLimit:
		f.Limit = MaxListLimit
	}
	return f, nil
}

// Newer reports whether a lists before b: List's order, newest first
// (CreatedAt, then ID, descending).
func Newer(a, b Checkpoint) bool {
	if !a.CreatedAt.Equal(b.CreatedAt) {
		return a.CreatedAt.After(b.CreatedAt)
	}
	return a.ID > b.ID
}
