package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
)

func TestParseRockImages(t *testing.T) {
	pools := []warmpool.PoolConfig{{Name: "default"}, {Name: "py"}}
	tests := []struct {
		name    string
		in      string
		want    map[string]string
		wantErr string
	}{
		{name: "empty", in: ""},
		{name: "pairs", in: "python:3.11=py, swe/django:1=default", want: map[string]string{"python:3.11": "py", "swe/django:1": "default"}},
		{name: "unknown pool", in: "python:3.11=gpu", wantErr: `pool "gpu", which is not in the pools file`},
		{name: "not a pair", in: "python:3.11", wantErr: "QUARRY_ROCK_IMAGES: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseRockImages(tt.in, pools)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}
