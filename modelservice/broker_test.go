package modelservice

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestClaimQuery_Normalized(t *testing.T) {
	tests := []struct {
		name string
		max  int
		want int
	}{
		{name: "zero is one", max: 0, want: 1},
		{name: "negative is one", max: -5, want: 1},
		{name: "one stays", max: 1, want: 1},
		{name: "more stays", max: 40, want: 40},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q := ClaimQuery{Owner: "o", Pool: "p", Labels: map[string]string{"k": "v"}, Max: tc.max, MaxBytes: 7, Wait: 3, Visibility: 9}
			want := q
			want.Max = tc.want
			assert.Equal(t, want, q.Normalized(), "only Max changes")
		})
	}
}

func TestWithinBytes(t *testing.T) {
	assert.True(t, WithinBytes(0, 0, 5000, 100), "the first item always fits")
	assert.True(t, WithinBytes(2, 60, 40, 100), "up to the bound")
	assert.False(t, WithinBytes(1, 60, 41, 100), "past the bound")
	assert.True(t, WithinBytes(3, 1<<40, 1<<40, 0), "zero: no bound")
}

func TestTranscriptQuery_Normalized(t *testing.T) {
	tests := []struct {
		name  string
		limit int
		want  int
	}{
		{name: "zero is one", limit: 0, want: 1},
		{name: "negative is one", limit: -1, want: 1},
		{name: "more stays", limit: 500, want: 500},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q := TranscriptQuery{LeaseID: "sbx-1", Owner: "o", After: "r1", Limit: tc.limit, MaxBytes: 3}
			want := q
			want.Limit = tc.want
			assert.Equal(t, want, q.Normalized(), "only Limit changes")
		})
	}
}
