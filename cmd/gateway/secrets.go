package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
)

// secretARNsVar names the variable that maps gateway variables to Secrets
// Manager secrets: "QUARRY_API_KEYS=arn:…,QUARRY_RELAY_SECRET=arn:…". At
// start-up each secret's value becomes its variable, so that a deployment
// keeps only ARNs in its configuration (and its Terraform state): AWS
// Lambda cannot inject secrets into the environment as ECS does.
const secretARNsVar = "QUARRY_SECRET_ARNS"

// secretsTimeout bounds reading every secret at start-up.
const secretsTimeout = 30 * time.Second

// maxSecretBytes bounds one secret's value (Secrets Manager's own limit).
const maxSecretBytes = 64 << 10

var secretVarPattern = regexp.MustCompile(`^QUARRY_[A-Z0-9_]+$`)

var _ secretReader = (*secretsmanager.Client)(nil)

// parseSecretARNs parses QUARRY_SECRET_ARNS: comma-separated VARIABLE=ARN
// pairs, each variable a QUARRY_* name at most once, each ARN a full ARN.
func parseSecretARNs(s string) (map[string]string, error) {
	out := map[string]string{}
	for i, pair := range strings.Split(s, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		name, arn, ok := strings.Cut(pair, "=")
		switch {
		case !ok:
			return nil, fmt.Errorf("%s: entry %d: want VARIABLE=ARN, got %q", secretARNsVar, i, pair)
		case !secretVarPattern.MatchString(name):
			return nil, fmt.Errorf("%s: entry %d: %q is not a QUARRY_* variable name", secretARNsVar, i, name)
		case !strings.HasPrefix(arn, "arn:"):
			return nil, fmt.Errorf("%s: %s: want the secret's full ARN, got %q", secretARNsVar, name, arn)
		case out[name] != "":
			return nil, fmt.Errorf("%s: %s appears twice", secretARNsVar, name)
		}
		out[name] = arn
	}
	return out, nil
}

// resolveSecrets reads the secret of each variable in arns and sets the
// variable to its value (surrounding whitespace trimmed), in name order. A
// variable that is set already keeps its value. An empty, binary or
// unreadable secret is an error naming the variable and the secret.
func resolveSecrets(ctx context.Context, api secretReader, arns map[string]string, lookup func(string) (string, bool), set func(k, v string) error) error {
	for _, name := range slices.Sorted(maps.Keys(arns)) {
		if v, ok := lookup(name); ok && v != "" {
			continue
		}
		out, err := api.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String(arns[name])})
		if err != nil {
			return fmt.Errorf("%s: read secret %s for %s: %w", secretARNsVar, arns[name], name, err)
		}
		v := strings.TrimSpace(aws.ToString(out.SecretString))
		switch {
		case v == "":
			return fmt.Errorf("%s: secret %s for %s has no string value: fill it with `aws secretsmanager put-secret-value`", secretARNsVar, arns[name], name)
		case len(v) > maxSecretBytes:
			return fmt.Errorf("%s: secret %s for %s: larger than %d bytes", secretARNsVar, arns[name], name, maxSecretBytes)
		}
		if err := set(name, v); err != nil {
			return fmt.Errorf("%s: set %s: %w", secretARNsVar, name, err)
		}
	}
	return nil
}

// loadSecrets resolves QUARRY_SECRET_ARNS into the environment, before the
// configuration is read; without it, it does nothing.
func loadSecrets(ctx context.Context) error {
	spec := os.Getenv(secretARNsVar)
	if spec == "" {
		return nil
	}
	arns, err := parseSecretARNs(spec)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, secretsTimeout)
	defer cancel()
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return fmt.Errorf("%s: load AWS configuration: %w", secretARNsVar, err)
	}
	if awsCfg.Region == "" {
		return errors.New(secretARNsVar + ": AWS_REGION: no AWS region is configured")
	}
	return resolveSecrets(ctx, secretsmanager.NewFromConfig(awsCfg), arns, os.LookupEnv, os.Setenv)
}
