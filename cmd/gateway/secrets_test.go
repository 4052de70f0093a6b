package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/internal/testenv"
)

func TestParseSecretARNs_NamesTheProblem(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want map[string]string
		err  string
	}{
		{name: "two", in: "QUARRY_API_KEYS=arn:aws:secretsmanager:us-east-1:1:secret:a, QUARRY_RELAY_SECRET=arn:aws:secretsmanager:us-east-1:1:secret:b",
			want: map[string]string{"QUARRY_API_KEYS": "arn:aws:secretsmanager:us-east-1:1:secret:a", "QUARRY_RELAY_SECRET": "arn:aws:secretsmanager:us-east-1:1:secret:b"}},
		{name: "empty entries ignored", in: ",QUARRY_API_KEYS=arn:x,", want: map[string]string{"QUARRY_API_KEYS": "arn:x"}},
		{name: "no equals", in: "QUARRY_API_KEYS", err: "want VARIABLE=ARN"},
		{name: "not a quarry variable", in: "PATH=arn:x", err: `"PATH" is not a QUARRY_* variable`},
		{name: "not an ARN", in: "QUARRY_API_KEYS=my-secret", err: "QUARRY_API_KEYS: want the secret's full ARN"},
		{name: "twice", in: "QUARRY_API_KEYS=arn:a,QUARRY_API_KEYS=arn:b", err: "appears twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseSecretARNs(tt.in)
			if tt.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), secretARNsVar)
				assert.Contains(t, err.Error(), tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestResolveSecrets_SetsUnsetVariables(t *testing.T) {
	values := map[string]*string{"arn:keys": aws.String(" qk_1,qk_2\n"), "arn:empty": aws.String("  "), "arn:binary": nil}
	api := fakeSecrets{get: func(in *secretsmanager.GetSecretValueInput) (*secretsmanager.GetSecretValueOutput, error) {
		v, ok := values[aws.ToString(in.SecretId)]
		if !ok {
			return nil, errors.New("ResourceNotFoundException")
		}
		return &secretsmanager.GetSecretValueOutput{SecretString: v}, nil
	}}
	tests := []struct {
		name    string
		arns    map[string]string
		env     map[string]string
		wantEnv map[string]string
		err     string
	}{
		{name: "resolved and trimmed", arns: map[string]string{"QUARRY_API_KEYS": "arn:keys"}, wantEnv: map[string]string{"QUARRY_API_KEYS": "qk_1,qk_2"}},
		{name: "an explicit value wins", arns: map[string]string{"QUARRY_API_KEYS": "arn:missing"}, env: map[string]string{"QUARRY_API_KEYS": "qk_explicit"},
			wantEnv: map[string]string{"QUARRY_API_KEYS": "qk_explicit"}},
		{name: "empty secret", arns: map[string]string{"QUARRY_RELAY_SECRET": "arn:empty"}, err: "QUARRY_RELAY_SECRET has no string value"},
		{name: "binary secret", arns: map[string]string{"QUARRY_RELAY_SECRET": "arn:binary"}, err: "has no string value"},
		{name: "unreadable", arns: map[string]string{"QUARRY_ECS_TOKEN_KEY": "arn:missing"}, err: "read secret arn:missing for QUARRY_ECS_TOKEN_KEY"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range tt.env {
				env[k] = v
			}
			lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
			set := func(k, v string) error { env[k] = v; return nil }
			err := resolveSecrets(t.Context(), api, tt.arns, lookup, set)
			if tt.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantEnv, env)
		})
	}
}

// loadSecrets reads real secrets from the emulator's Secrets Manager
// (QUARRY_TEST_AWS=1) into the environment.
func TestLoadSecrets_FromSecretsManager(t *testing.T) {
	testenv.AWS(t)
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	client := secretsmanager.NewFromConfig(testAWSConfig(ctx, t))
	name := fmt.Sprintf("quarry-test/api-keys-%x", time.Now().UnixNano())
	out, err := client.CreateSecret(ctx, &secretsmanager.CreateSecretInput{Name: aws.String(name), SecretString: aws.String("qk_from_secrets_manager_0123456789")})
	require.NoError(t, err, "QUARRY_TEST_AWS=1 but Secrets Manager (AWS_ENDPOINT_URL=%q) does not answer", os.Getenv("AWS_ENDPOINT_URL"))
	t.Cleanup(func() {
		_, err := client.DeleteSecret(context.Background(), &secretsmanager.DeleteSecretInput{SecretId: out.ARN, ForceDeleteWithoutRecovery: aws.Bool(true)})
		assert.NoError(t, err)
	})
	t.Setenv("QUARRY_API_KEYS", "")
	require.NoError(t, os.Unsetenv("QUARRY_API_KEYS"))
	t.Setenv(secretARNsVar, "QUARRY_API_KEYS="+aws.ToString(out.ARN))

	require.NoError(t, loadSecrets(ctx))
	assert.Equal(t, "qk_from_secrets_manager_0123456789", os.Getenv("QUARRY_API_KEYS"))
}
