package main

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
)

func TestLoadAWS_NoRegionIsAnError(t *testing.T) {
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")
	t.Setenv("AWS_CONFIG_FILE", "/nonexistent")
	t.Setenv("AWS_PROFILE", "")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	_, err := loadAWS(t.Context(), DynamoConfig{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "AWS_REGION")

	cfg, err := loadAWS(t.Context(), DynamoConfig{Region: "eu-west-1"})
	require.NoError(t, err)
	assert.Equal(t, "eu-west-1", cfg.Region, "QUARRY_DYNAMODB_REGION wins over the SDK's chain")
}

// count returns a counter's value.
func count(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}

// doerFunc is an aws.HTTPClient whose answer a test decides.
type doerFunc func(*http.Request) (*http.Response, error)

func (f doerFunc) Do(r *http.Request) (*http.Response, error) { return f(r) }

// The SDK's requests are counted by DynamoDB operation and by the manager
// call they serve, failed ones included.
func TestCountingClient_CountsByOperationAndCaller(t *testing.T) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "requests"}, []string{"operation", "caller"})
	sent := 0
	c := countingClient{requests: requests, next: doerFunc(func(*http.Request) (*http.Response, error) {
		sent++
		if sent == 3 {
			return nil, errors.New("connection refused")
		}
		return &http.Response{StatusCode: http.StatusOK}, nil
	})}
	tests := []struct {
		target string
		ctx    context.Context
	}{
		{"DynamoDB_20120810.TransactWriteItems", warmpool.ContextWithCaller(context.Background(), warmpool.CallerAcquire)},
		{"DynamoDB_20120810.TransactWriteItems", warmpool.ContextWithCaller(context.Background(), warmpool.CallerAcquire)},
		{"DynamoDB_20120810.GetItem", warmpool.ContextWithCaller(context.Background(), warmpool.CallerGet)},
		{"DynamoDB_20120810.Query", context.Background()},
		{"", context.Background()},
	}
	for _, tc := range tests {
		req, err := http.NewRequestWithContext(tc.ctx, http.MethodPost, "http://127.0.0.1:1/", strings.NewReader("{}"))
		require.NoError(t, err)
		if tc.target != "" {
			req.Header.Set("X-Amz-Target", tc.target)
		}
		_, _ = c.Do(req)
	}
	assert.Equal(t, 5, sent, "every request is sent on")
	assert.Equal(t, 2.0, count(t, requests.WithLabelValues("TransactWriteItems", "acquire")))
	assert.Equal(t, 1.0, count(t, requests.WithLabelValues("GetItem", "get")), "a failed request counts too")
	assert.Equal(t, 1.0, count(t, requests.WithLabelValues("Query", "other")))
	assert.Equal(t, 1.0, count(t, requests.WithLabelValues("unknown", "other")))
}
