package warmpool

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/quarryhq/quarry/providers"
)

// slotted is a provider with start slots (only StartSlots is called).
type slotted struct {
	providers.Provider
	slots int
}

func (s slotted) StartSlots() int { return s.slots }

// A pool keeps enough Launch calls in flight to fill its provider's start
// slots: ECS's default 1,900 in chunks of 50 is 38 calls, where the default
// 4 would hold 200 tasks starting (about 2 launches/s with Fargate's
// starts, a tenth of AWS's rate).
func TestLaunchConcurrency_FillsTheProvidersStartSlots(t *testing.T) {
	cfg := Config{}.WithDefaults()
	assert.Equal(t, 4, launchConcurrency(nil, cfg), "a provider without start slots: QUARRY_LAUNCH_CONCURRENCY")
	assert.Equal(t, 38, launchConcurrency(slotted{slots: 1900}, cfg))
	assert.Equal(t, 39, launchConcurrency(slotted{slots: 1901}, cfg), "rounded up")
	assert.Equal(t, 4, launchConcurrency(slotted{slots: 100}, cfg), "never below QUARRY_LAUNCH_CONCURRENCY")
	cfg.LaunchConcurrency = 60
	assert.Equal(t, 60, launchConcurrency(slotted{slots: 1900}, cfg))
}
