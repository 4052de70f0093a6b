package dynamostore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConfig_Validate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string // "" for valid
	}{
		{name: "defaults", cfg: Config{}},
		{name: "bad table name", cfg: Config{TasksTable: "a b"}, want: "QUARRY_DYNAMODB_TASKS_TABLE"},
		{name: "same tables", cfg: Config{TasksTable: "t1t", LeasesTable: "t1t"}, want: "QUARRY_DYNAMODB_LEASES_TABLE"},
		{name: "too many shards", cfg: Config{Shards: 65}, want: "QUARRY_DYNAMODB_SHARDS"},
		{name: "negative shards", cfg: Config{Shards: -1}, want: "QUARRY_DYNAMODB_SHARDS"},
		{name: "candidates", cfg: Config{ClaimCandidates: 101}, want: "QUARRY_DYNAMODB_CLAIM_CANDIDATES"},
		{name: "attempts", cfg: Config{MaxAttempts: -2}, want: "QUARRY_DYNAMODB_MAX_ATTEMPTS"},
		{name: "negative ttl", cfg: Config{EndedTTL: -time.Second}, want: "QUARRY_DYNAMODB_ENDED_TTL"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	_, err := New(nil, Config{})
	assert.Error(t, err)
	_, err = New(struct{ API }{}, Config{Shards: 100})
	assert.ErrorContains(t, err, "QUARRY_DYNAMODB_SHARDS")
}

func TestConfig_Defaults(t *testing.T) {
	c := Config{}.WithDefaults()
	assert.Equal(t, "quarry-tasks", c.TasksTable)
	assert.Equal(t, "quarry-leases", c.LeasesTable)
	assert.Equal(t, 8, c.Shards)
	assert.Len(t, Config{Region: "eu-west-1"}.SDKOptions(), 2)
	assert.Len(t, Config{}.SDKOptions(), 1)
	assert.Equal(t, 83, MaxReserve(8))
}
