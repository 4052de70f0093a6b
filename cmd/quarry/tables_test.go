package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// `quarry tables` refuses bad settings before it calls AWS, naming the
// flag or variable to fix. (Creating and deleting real tables is exercised
// by the integration tests against the AWS emulator.)
func TestRun_Tables_BadSettingsNameTheirFlag(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{name: "no subcommand", args: []string{"tables", "drop"}, want: `unknown command "drop"`},
		{name: "zero shards", args: []string{"tables", "create", "--shards", "0"}, want: "--shards"},
		{name: "too many shards", args: []string{"tables", "create", "--shards", "65"}, want: "QUARRY_DYNAMODB_SHARDS"},
		{name: "shards from env not a number", env: map[string]string{"QUARRY_DYNAMODB_SHARDS": "many"}, args: []string{"tables", "create"}, want: "QUARRY_DYNAMODB_SHARDS"},
		{name: "bad table name", args: []string{"tables", "create", "--tasks-table", "a b"}, want: "QUARRY_DYNAMODB_TASKS_TABLE"},
		{name: "same table twice", env: map[string]string{"QUARRY_DYNAMODB_LEASES_TABLE": "quarry-tasks"}, args: []string{"tables", "delete"}, want: "QUARRY_DYNAMODB_LEASES_TABLE"},
		{name: "bad timeout", args: []string{"tables", "create", "--timeout", "0s"}, want: "--timeout"},
		{name: "extra argument", args: []string{"tables", "delete", "now"}, want: `unexpected argument "now"`},
		{name: "no region", env: map[string]string{"AWS_REGION": "", "AWS_DEFAULT_REGION": "", "AWS_CONFIG_FILE": "/nonexistent", "AWS_PROFILE": ""},
			args: []string{"tables", "create"}, want: "AWS_REGION"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
			t.Setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1") // nothing may be called
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			res := runCLI(t, "", tc.args...)
			require.Equal(t, 1, res.code, res.stdout)
			assert.Contains(t, res.stderr, tc.want)
			assert.Empty(t, res.stdout)
		})
	}
}

func TestRun_Tables_HelpListsTheSettings(t *testing.T) {
	res := runCLI(t, "", "tables", "create", "-h")
	require.Equal(t, 0, res.code, res.stderr)
	for _, want := range []string{"--tasks-table", "QUARRY_DYNAMODB_TASKS_TABLE", "QUARRY_DYNAMODB_SHARDS", "AWS_ENDPOINT_URL", "--checkpoint-table", "QUARRY_CHECKPOINT_TABLE"} {
		assert.Contains(t, res.stdout, want)
	}
}
