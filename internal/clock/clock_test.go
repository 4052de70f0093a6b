package clock

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestSystem_NowIsTheWallClock(t *testing.T) {
	before := time.Now()
	got := System{}.Now()
	after := time.Now()
	assert.False(t, got.Before(before), "System.Now %s is before %s", got, before)
	assert.False(t, got.After(after), "System.Now %s is after %s", got, after)
	assert.True(t, got.Location() == time.Local, "System.Now is in time.Local, as time.Now")
}
