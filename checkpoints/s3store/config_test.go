package s3store

import (
	"time"

	"testing"

	"github.com/stretchr/testify/assert"
)

func TestConfig_Validate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string // "" for valid
	}{
		{name: "bucket only: defaults fill the rest", cfg: Config{Bucket: "b"}},
		{name: "no bucket", cfg: Config{}, want: "QUARRY_CHECKPOINT_BUCKET"},
		{name: "part below S3's minimum", cfg: Config{Bucket: "b", PartSize: 1 << 20}, want: "QUARRY_CHECKPOINT_PART_SIZE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

func TestConfig_WithDefaults(t *testing.T) {
	c := Config{Bucket: "b"}.WithDefaults()
	assert.Equal(t, DefaultTable, c.Table)
	assert.Equal(t, DefaultPrefix, c.Prefix)
	assert.Equal(t, int64(DefaultPartSize), c.PartSize)
	assert.Equal(t, DefaultUploadConcurrency, c.UploadConcurrency)
	assert.Equal(t, DefaultPendingGrace, c.PendingGrace)
}

// An owner's by-owner sort keys order as checkpoints.Newer does: by
// creation time (fixed width, so 9 < 10 digits), then id.
func TestOwnerSK_SortsAsNewer(t *testing.T) {
	early, late := ownerSK(unix(9), "ckp-b"), ownerSK(unix(10), "ckp-a")
	assert.Less(t, early, late)
	assert.Less(t, ownerSK(unix(10), "ckp-a"), ownerSK(unix(10), "ckp-b"))
}

func unix(ns int64) time.Time { return time.Unix(0, ns) }
