package badinput_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/quarryhq/quarry/internal/badinput"
)

func TestNew_NamesTheFieldAndIsFoundWrapped(t *testing.T) {
	err := fmt.Errorf("create: %w", badinput.New("lease_seconds", "must be at most %d", 3600))
	var bad *badinput.Error
	assert.True(t, errors.As(err, &bad))
	assert.Equal(t, "lease_seconds", bad.Field)
	assert.Equal(t, "must be at most 3600", bad.Message)
	assert.Equal(t, "lease_seconds: must be at most 3600", bad.Error())
}

func TestPrintableAndAlnum(t *testing.T) {
	assert.True(t, badinput.Printable("a b~!"))
	assert.True(t, badinput.Printable(""))
	assert.False(t, badinput.Printable("tab\there"))
	assert.False(t, badinput.Printable("é"))
	assert.True(t, badinput.Alnum('z') && badinput.Alnum('Q') && badinput.Alnum('7'))
	assert.False(t, badinput.Alnum('-') || badinput.Alnum(' ') || badinput.Alnum(0xc3))
}
