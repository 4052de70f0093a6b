package warmpool_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/quarryhq/quarry/warmpool"
)

func TestNewLeaseID_ShapeAndUniqueness(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		id := warmpool.NewLeaseID()
		assert.Regexp(t, `^sbx-[a-z2-7]{26}$`, id)
		assert.True(t, warmpool.ValidLeaseID(id))
		assert.False(t, seen[id])
		seen[id] = true
		assert.Regexp(t, `^tsk-[a-z2-7]{26}$`, warmpool.NewTaskID())
	}
}

func TestValidLeaseID(t *testing.T) {
	tests := []struct {
		name string
		id   string
		want bool
	}{
		{name: "generated", id: warmpool.NewLeaseID(), want: true},
		{name: "task id", id: warmpool.NewTaskID(), want: false},
		{name: "empty", id: "", want: false},
		{name: "short", id: "sbx-abc", want: false},
		{name: "upper case", id: "sbx-AAAAAAAAAAAAAAAAAAAAAAAAAA", want: false},
		{name: "path", id: "sbx-../../../../etc/passwd/aaaa", want: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, warmpool.ValidLeaseID(tc.id))
		})
	}
}
