package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/checkpoints/s3store"
	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/modelservice/dynamobroker"
	"github.com/quarryhq/quarry/warmpool/dynamostore"
)

const lambdaTestKey = "qk_lambda_test_key_0123456789abcdef"

// testAWSConfig loads the SDK's configuration from the environment
// (AWS_ENDPOINT_URL, AWS_REGION, credentials), which must name a region.
// Its callers need an AWS endpoint and ask testenv.AWS first.
func testAWSConfig(ctx context.Context, t *testing.T) aws.Config {
	t.Helper()
	cfg, err := config.LoadDefaultConfig(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, cfg.Region, "QUARRY_TEST_AWS=1 needs AWS_REGION")
	return cfg
}

// lambdaEnv is a Lambda handler on the real stack: the process provider
// with real agents, and the store the test chose.
type lambdaEnv struct {
	t *testing.T
	h *lambdaHandler
}

// buildAgent builds the exec agent into a temporary directory.
func buildAgent(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "execagent")
	build := exec.Command("go", "build", "-o", bin, "./cmd/execagent")
	build.Dir = filepath.Join("..", "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build execagent: %s", out)
	return bin
}

// newLambdaEnv configures the gateway through its QUARRY_* variables, as
// the Lambda function's environment does, plus extra, and builds the
// handler as runLambda does (no background loops).
func newLambdaEnv(t *testing.T, extra map[string]string) *lambdaEnv {
	t.Helper()
	agent := buildAgent(t)
	data := t.TempDir()
	vars := map[string]string{
		"QUARRY_DATA_DIR":     data,
		"QUARRY_POOLS":        `{"pools": [{"name": "default", "min_warm": 1, "max_total": 3}]}`, // inline, as in Lambda
		"QUARRY_AGENT_BINARY": agent,
		"QUARRY_API_KEYS":     lambdaTestKey,
		"QUARRY_LOG_LEVEL":    "warn",
		"QUARRY_ADDR":         "127.0.0.1:0",
		// As in AWS: sandboxes reach the relay at the API's URL.
		"QUARRY_SANDBOX_GATEWAY_URL": "https://abcdef123.execute-api.us-east-1.amazonaws.com",
	}
	for k, v := range extra {
		vars[k] = v
	}
	for k, v := range vars {
		t.Setenv(k, v)
	}
	t.Cleanup(func() { stopAllTasks(t, agent, filepath.Join(data, "process")) })
	cfg, log, err := loadConfig()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	h, closeFn, err := newLambdaHandler(ctx, cfg, log)
	require.NoError(t, err)
	t.Cleanup(func() { closeFn(context.Background()) })
	return &lambdaEnv{t: t, h: h}
}

// fixture reads testdata/lambda/name.json with its {{NAME}} placeholders
// replaced.
func fixture(t *testing.T, name string, vars map[string]string) json.RawMessage {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "lambda", name+".json"))
	require.NoError(t, err)
	s := string(b)
	for k, v := range vars {
		s = strings.ReplaceAll(s, "{{"+k+"}}", v)
	}
	require.NotContains(t, s, "{{", "fixture %s has a placeholder left", name)
	return json.RawMessage(s)
}

// invokeHTTP invokes the handler with an HTTP fixture and returns the
// answer and its decoded body.
func (e *lambdaEnv) invokeHTTP(name string, vars map[string]string) (events.APIGatewayV2HTTPResponse, []byte) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), deadline)
	defer cancel()
	out, err := e.h.Invoke(ctx, fixture(e.t, name, vars))
	require.NoError(e.t, err, "invoke %s", name)
	// Through JSON, as the runtime sends it back.
	raw, err := json.Marshal(out)
	require.NoError(e.t, err)
	var resp events.APIGatewayV2HTTPResponse
	require.NoError(e.t, json.Unmarshal(raw, &resp))
	body := []byte(resp.Body)
	if resp.IsBase64Encoded {
		body, err = base64.StdEncoding.DecodeString(resp.Body)
		require.NoError(e.t, err)
	}
	return resp, body
}

// poolReady returns the default pool's ready count.
func (e *lambdaEnv) poolReady() int {
	e.t.Helper()
	resp, body := e.invokeHTTP("pools_function_url", map[string]string{"KEY": lambdaTestKey})
	require.Equal(e.t, http.StatusOK, resp.StatusCode, "body %s", body)
	var pools struct {
		Pools []struct {
			Name  string `json:"name"`
			Ready int    `json:"ready"`
		} `json:"pools"`
	}
	require.NoError(e.t, json.Unmarshal(body, &pools))
	require.Len(e.t, pools.Pools, 1)
	return pools.Pools[0].Ready
}

// lifecycle runs the fixtures of a sandbox's life through the handler: a
// scheduled pass fills the pool, then create, exec (JSON and SSE), upload
// and download of binary bytes, release.
func (e *lambdaEnv) lifecycle() {
	t := e.t
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	// An expired checkpoint, for the scheduled pass's purge.
	now := time.Now()
	_, err := e.h.purge.store.Put(ctx, checkpoints.Checkpoint{ID: checkpoints.NewID(), Owner: "o", Format: "tar+gzip",
		Paths: []string{"/w"}, CreatedAt: now.Add(-2 * time.Hour), ExpiresAt: now.Add(-time.Hour)}, strings.NewReader("old"), 1<<20)
	require.NoError(t, err)
	out, err := e.h.Invoke(ctx, fixture(t, "schedule", nil))
	require.NoError(t, err)
	assert.Equal(t, true, out.(reconcileResult).Reconciled)
	assert.Equal(t, 1, e.poolReady(), "the scheduled pass launched min_warm and waited for it")
	assert.Equal(t, 1.0, counterValue(t, e.h.purge.purged), "the scheduled pass purged the expired checkpoint")

	key := map[string]string{"KEY": lambdaTestKey}
	resp, body := e.invokeHTTP("create", key)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "body %s", body)
	assert.Contains(t, resp.Headers["Content-Type"], "application/json")
	assert.False(t, resp.IsBase64Encoded, "JSON travels as text")
	var sb struct {
		ID    string `json:"id"`
		State string `json:"state"`
	}
	require.NoError(t, json.Unmarshal(body, &sb))
	require.NotEmpty(t, sb.ID)
	ids := map[string]string{"KEY": lambdaTestKey, "ID": sb.ID}

	resp, body = e.invokeHTTP("exec", ids)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	var res struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
	}
	require.NoError(t, json.Unmarshal(body, &res))
	assert.Equal(t, 0, res.ExitCode)
	assert.Equal(t, "hi\n", res.Stdout)
	assert.Equal(t, "err\n", res.Stderr)

	resp, body = e.invokeHTTP("exec_stream", ids)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	assert.Contains(t, resp.Headers["Content-Type"], "text/event-stream")
	assert.Contains(t, string(body), "event: stdout")
	assert.Contains(t, string(body), "event: exit", "the whole stream, up to its end, in one answer")

	blob := make([]byte, 64<<10)
	_, err = rand.Read(blob)
	require.NoError(t, err)
	resp, body = e.invokeHTTP("upload", map[string]string{"KEY": lambdaTestKey, "ID": sb.ID, "BLOB": base64.StdEncoding.EncodeToString(blob)})
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	assert.Contains(t, string(body), fmt.Sprintf(`"bytes":%d`, len(blob)))

	resp, body = e.invokeHTTP("download", ids)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	assert.True(t, resp.IsBase64Encoded, "binary bytes travel base64-encoded")
	assert.True(t, bytes.Equal(blob, body), "the downloaded bytes are the uploaded ones")

	resp, body = e.invokeHTTP("release", ids)
	require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	require.NoError(t, json.Unmarshal(body, &sb))
	assert.Equal(t, "released", sb.State)

	resp, body = e.invokeHTTP("exec", ids)
	assert.Equal(t, http.StatusGone, resp.StatusCode, "body %s", body)
}

// The handler serves a sandbox's whole life from event fixtures, on the
// embedded store and the process provider with real agents.
func TestLambda_Invoke_SandboxLifecycleEmbeddedStore(t *testing.T) {
	e := newLambdaEnv(t, nil)
	e.lifecycle()

	resp, body := e.invokeHTTP("unauthorized", nil)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	var shape struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(body, &shape), "body %s", body)
	assert.NotEmpty(t, shape.Error.Code)
	assert.NotEmpty(t, shape.Error.Message)
}

// The same life on the DynamoDB lease store and relay broker against the
// emulator (QUARRY_TEST_AWS=1; AWS_ENDPOINT_URL, AWS_REGION and
// credentials from the environment), as the function runs in AWS.
func TestLambda_Invoke_SandboxLifecycleDynamoDB(t *testing.T) {
	testenv.AWS(t)
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	client := dynamodb.NewFromConfig(testAWSConfig(ctx, t))
	_, err := client.ListTables(ctx, &dynamodb.ListTablesInput{Limit: aws.Int32(1)})
	require.NoError(t, err, "QUARRY_TEST_AWS=1 but the DynamoDB endpoint (AWS_ENDPOINT_URL=%q) does not answer", os.Getenv("AWS_ENDPOINT_URL"))

	prefix := fmt.Sprintf("quarry-lambda-test-%x", time.Now().UnixNano()&0xffffffffff)
	storeCfg := dynamostore.Config{TasksTable: prefix + "-tasks", LeasesTable: prefix + "-leases"}
	relayTable := prefix + "-relay"
	require.NoError(t, dynamostore.CreateTables(ctx, client, storeCfg))
	require.NoError(t, dynamobroker.CreateTables(ctx, client, relayTable))
	ckTable, ckBucket := prefix+"-checkpoints", prefix+"-checkpoints"
	require.NoError(t, s3store.CreateTables(ctx, client, ckTable))
	s3c := s3.NewFromConfig(testAWSConfig(ctx, t), func(o *s3.Options) { o.UsePathStyle = true })
	_, err = s3c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(ckBucket)})
	require.NoError(t, err)
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		assert.NoError(t, dynamostore.DeleteTables(cctx, client, storeCfg))
		assert.NoError(t, dynamobroker.DeleteTables(cctx, client, relayTable))
		assert.NoError(t, s3store.DeleteTables(cctx, client, ckTable))
		_, err := s3c.DeleteBucket(cctx, &s3.DeleteBucketInput{Bucket: aws.String(ckBucket)})
		assert.NoError(t, err, "the purge emptied the checkpoint bucket")
	})

	vars := map[string]string{
		"QUARRY_STORE":                 "dynamodb",
		"QUARRY_DYNAMODB_TASKS_TABLE":  storeCfg.TasksTable,
		"QUARRY_DYNAMODB_LEASES_TABLE": storeCfg.LeasesTable,
		"QUARRY_RELAY_BROKER":          "dynamodb",
		"QUARRY_RELAY_DYNAMODB_TABLE":  relayTable,
		"QUARRY_RELAY_SECRET":          "lambda-test-relay-secret-0123456789abcdef",
		"QUARRY_CHECKPOINT_STORE":      "s3",
		"QUARRY_CHECKPOINT_BUCKET":     ckBucket,
		"QUARRY_CHECKPOINT_TABLE":      ckTable,
	}
	e := newLambdaEnv(t, vars)
	cfg, _, err := loadConfig()
	require.NoError(t, err)
	require.NoError(t, validateLambda(cfg, "dynamodb"), "the configuration is one Lambda mode accepts")
	e.lifecycle()
}

func TestLambda_Invoke_UnknownEventIsAnError(t *testing.T) {
	h := &lambdaHandler{log: slog.New(slog.DiscardHandler)}
	tests := []struct {
		name    string
		payload string
		want    string
	}{
		{name: "not JSON", payload: `nope`, want: "decode invocation event"},
		{name: "S3 event", payload: `{"Records": [{"eventSource": "aws:s3"}]}`, want: "neither an HTTP event"},
		{name: "other EventBridge event", payload: `{"source": "aws.ec2", "detail-type": "EC2 Instance State-change Notification"}`, want: "neither an HTTP event"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.Invoke(t.Context(), json.RawMessage(tt.payload))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestToFastHTTP_CarriesTheEvent(t *testing.T) {
	ev := events.APIGatewayV2HTTPRequest{
		RawPath:         "/v1/sandboxes/sb-1/files",
		RawQueryString:  "path=a%20b.txt&mode=0644",
		Cookies:         []string{"a=1", "b=2"},
		Headers:         map[string]string{"x-multi": "one,two", "content-type": "application/octet-stream"},
		Body:            base64.StdEncoding.EncodeToString([]byte{0, 1, 2, 255}),
		IsBase64Encoded: true,
		RequestContext: events.APIGatewayV2HTTPRequestContext{
			DomainName: "api.example.com",
			HTTP:       events.APIGatewayV2HTTPRequestContextHTTPDescription{Method: "PUT", Path: "/ignored"},
		},
	}
	var req fasthttp.Request
	require.NoError(t, toFastHTTP(ev, &req))
	assert.Equal(t, "PUT", string(req.Header.Method()))
	assert.Equal(t, "/v1/sandboxes/sb-1/files", string(req.URI().Path()))
	assert.Equal(t, "a b.txt", string(req.URI().QueryArgs().Peek("path")))
	assert.Equal(t, "one,two", string(req.Header.Peek("x-multi")))
	assert.Equal(t, "1", string(req.Header.Cookie("a")))
	assert.Equal(t, "2", string(req.Header.Cookie("b")))
	assert.Equal(t, "api.example.com", string(req.Header.Host()))
	assert.Equal(t, []byte{0, 1, 2, 255}, req.Body())
	assert.Equal(t, 4, req.Header.ContentLength())
}

func TestToFastHTTP_BadEventsAreRefused(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*events.APIGatewayV2HTTPRequest)
		want   string
	}{
		{name: "no method", mutate: func(e *events.APIGatewayV2HTTPRequest) { e.RequestContext.HTTP.Method = "" }, want: "requestContext.http.method"},
		{name: "relative path", mutate: func(e *events.APIGatewayV2HTTPRequest) { e.RawPath = "v1" }, want: "rawPath"},
		{name: "bad base64", mutate: func(e *events.APIGatewayV2HTTPRequest) { e.Body, e.IsBase64Encoded = "!!", true }, want: "not valid base64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := events.APIGatewayV2HTTPRequest{RawPath: "/healthz"}
			ev.RequestContext.HTTP.Method = "GET"
			tt.mutate(&ev)
			var req fasthttp.Request
			err := toFastHTTP(ev, &req)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestFromFastHTTP_ConvertsTheAnswer(t *testing.T) {
	tests := []struct {
		name        string
		set         func(*fasthttp.Response)
		wantBase64  bool
		wantBody    string
		wantCookies []string
		wantHeader  map[string]string
		wantErr     string
	}{
		{
			name: "JSON as text, cookies apart, repeated headers joined",
			set: func(r *fasthttp.Response) {
				r.Header.SetContentType("application/json")
				r.Header.Add("Vary", "Accept")
				r.Header.Add("Vary", "Authorization")
				r.Header.Add("Set-Cookie", "a=1")
				r.Header.Add("Set-Cookie", "b=2")
				r.SetBodyString(`{"ok":true}`)
			},
			wantBody: `{"ok":true}`, wantCookies: []string{"a=1", "b=2"},
			wantHeader: map[string]string{"Vary": "Accept, Authorization", "Content-Type": "application/json"},
		},
		{
			name: "binary as base64",
			set: func(r *fasthttp.Response) {
				r.Header.SetContentType("application/octet-stream")
				r.SetBody([]byte{0xff, 0, 1})
			},
			wantBase64: true, wantBody: base64.StdEncoding.EncodeToString([]byte{0xff, 0, 1}),
		},
		{
			name: "text that is not UTF-8 as base64",
			set: func(r *fasthttp.Response) {
				r.Header.SetContentType("text/plain")
				r.SetBody([]byte{'a', 0xff})
			},
			wantBase64: true, wantBody: base64.StdEncoding.EncodeToString([]byte{'a', 0xff}),
		},
		{
			name: "stream read to its end",
			set: func(r *fasthttp.Response) {
				r.Header.SetContentType("text/event-stream")
				r.SetBodyStream(strings.NewReader("event: exit\ndata: {}\n\n"), -1)
			},
			wantBody: "event: exit\ndata: {}\n\n",
		},
		{
			name: "stream over the Lambda limit",
			set: func(r *fasthttp.Response) {
				r.Header.SetContentType("application/x-tar")
				r.SetBodyStream(bytes.NewReader(make([]byte, maxLambdaBody+10)), -1)
			},
			wantErr: "response limit",
		},
		{
			name: "binary over the limit once encoded",
			set: func(r *fasthttp.Response) {
				r.Header.SetContentType("application/octet-stream")
				r.SetBody(make([]byte, maxLambdaBody*3/4+100))
			},
			wantErr: "base64-encoded",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r fasthttp.Response
			tt.set(&r)
			out, err := fromFastHTTP(&r)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantBase64, out.IsBase64Encoded)
			assert.Equal(t, tt.wantBody, out.Body)
			assert.Equal(t, tt.wantCookies, out.Cookies)
			for k, v := range tt.wantHeader {
				assert.Equal(t, v, out.Headers[k], "header %s", k)
			}
			assert.NotContains(t, out.Headers, "Content-Length")
		})
	}
}

func TestValidateLambda_NamesTheVariable(t *testing.T) {
	valid := Config{Store: "dynamodb", GatewayConfig: GatewayConfig{APIKeys: []string{lambdaTestKey}},
		CheckpointConfig: CheckpointConfig{Config: checkpoints.Config{Store: checkpoints.StoreS3}}}
	tests := []struct {
		name   string
		mutate func(*Config)
		broker string
		want   string
	}{
		{name: "valid", mutate: func(*Config) {}, broker: "dynamodb"},
		{name: "embedded store", mutate: func(c *Config) { c.Store = "embedded" }, broker: "dynamodb", want: "QUARRY_STORE"},
		{name: "memory relay", mutate: func(*Config) {}, broker: "memory", want: "QUARRY_RELAY_BROKER"},
		{name: "no API keys", mutate: func(c *Config) { c.APIKeys = nil }, broker: "dynamodb", want: "QUARRY_API_KEYS"},
		{name: "embedded checkpoint store", mutate: func(c *Config) { c.CheckpointConfig.Store = "" }, broker: "dynamodb", want: "QUARRY_CHECKPOINT_STORE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid
			tt.mutate(&c)
			err := validateLambda(c, tt.broker)
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestInLambda_DetectsTheRuntimeAPI(t *testing.T) {
	assert.True(t, inLambda(func(k string) string {
		if k == "AWS_LAMBDA_RUNTIME_API" {
			return "127.0.0.1:9001"
		}
		return ""
	}))
	assert.False(t, inLambda(func(string) string { return "" }))
}

func TestLoadPools_InlineOrFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pools.yaml")
	require.NoError(t, os.WriteFile(file, []byte("pools:\n  - name: fromfile\n    max_total: 2\n"), 0o600))
	tests := []struct {
		name      string
		pools     string
		poolsFile string
		wantPool  string
		wantErr   string
	}{
		{name: "inline JSON", pools: `{"pools": [{"name": "inline", "max_total": 2}]}`, wantPool: "inline"},
		{name: "inline YAML", pools: "pools:\n  - name: yaml\n    max_total: 2\n", wantPool: "yaml"},
		{name: "file", poolsFile: file, wantPool: "fromfile"},
		{name: "neither: the default pool", wantPool: "default"},
		{name: "both", pools: `{"pools": [{"name": "a"}]}`, poolsFile: file, wantErr: "QUARRY_POOLS and QUARRY_POOLS_FILE"},
		{name: "inline without pools", pools: `{"pools": []}`, wantErr: "QUARRY_POOLS: pools: at least one pool is required"},
		{name: "inline invalid", pools: `{"pools": [{"name": "Bad Name", "max_total": 2}]}`, wantErr: "QUARRY_POOLS:"},
		{name: "inline unknown provider", pools: `{"pools": [{"name": "a", "provider": "vm", "max_total": 2}]}`, wantErr: "QUARRY_POOLS: pool \"a\": unknown provider"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pools, err := loadPools(Config{Provider: "process", Pools: tt.pools, PoolsFile: tt.poolsFile})
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Len(t, pools, 1)
			assert.Equal(t, tt.wantPool, pools[0].Name)
			assert.Equal(t, "process", pools[0].Provider)
		})
	}
}

// run serves Lambda invocations when the runtime API is set, and refuses a
// configuration that cannot work across function instances before it
// builds anything.
func TestRun_InLambdaRefusesPerInstanceState(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{name: "embedded store", env: map[string]string{"QUARRY_STORE": "embedded"}, want: "QUARRY_STORE"},
		{name: "memory relay", env: map[string]string{"QUARRY_STORE": "dynamodb", "QUARRY_RELAY_BROKER": "memory"}, want: "QUARRY_RELAY_BROKER"},
		{name: "no API keys", env: map[string]string{"QUARRY_STORE": "dynamodb", "QUARRY_RELAY_BROKER": "dynamodb", "QUARRY_API_KEYS": ""}, want: "QUARRY_API_KEYS"},
		{name: "embedded checkpoint store", env: map[string]string{"QUARRY_STORE": "dynamodb", "QUARRY_RELAY_BROKER": "dynamodb"}, want: "QUARRY_CHECKPOINT_STORE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:1")
			t.Setenv("QUARRY_DATA_DIR", t.TempDir())
			t.Setenv("QUARRY_API_KEYS", lambdaTestKey)
			t.Setenv("QUARRY_SECRET_ARNS", "")
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			err := run(t.Context(), io.Discard)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.Contains(t, err.Error(), "AWS Lambda")
		})
	}
}
