package defaults_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/quarryhq/quarry/internal/defaults"
)

func TestSet_OnlyZeroTakesTheDefault(t *testing.T) {
	s, d, n := "", time.Duration(0), int64(7)
	defaults.Set(&s, "x")
	defaults.Set(&d, time.Second)
	defaults.Set(&n, 9)
	assert.Equal(t, "x", s)
	assert.Equal(t, time.Second, d)
	assert.Equal(t, int64(7), n, "a set value stays")
	neg := -time.Second
	defaults.Set(&neg, time.Minute)
	assert.Equal(t, -time.Second, neg, "negative is not zero")
}

func TestPositive_ZeroAndNegativeTakeTheDefault(t *testing.T) {
	a, b, c := time.Duration(0), -time.Second, 3*time.Second
	defaults.Positive(&a, time.Minute)
	defaults.Positive(&b, time.Minute)
	defaults.Positive(&c, time.Minute)
	assert.Equal(t, []time.Duration{time.Minute, time.Minute, 3 * time.Second}, []time.Duration{a, b, c})
}
