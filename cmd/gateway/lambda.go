package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/kelseyhightower/envconfig"
	"github.com/valyala/fasthttp"

	"github.com/quarryhq/quarry/checkpoints"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/warmpool"
)

// Limits of AWS Lambda's buffered (not streamed) invocations: a request or
// response payload is at most 6 MB of JSON, so bodies, base64 included,
// must stay under it with room for the headers.
const (
	maxLambdaPayload     = 6 << 20
	lambdaPayloadHeadway = 64 << 10
	// maxLambdaBody bounds the encoded body of a response.
	maxLambdaBody = maxLambdaPayload - lambdaPayloadHeadway
	// defaultReconcileTimeout bounds a scheduled pass when the invocation
	// carries no deadline (tests, direct calls).
	defaultReconcileTimeout = 5 * time.Minute
)

// inLambda reports whether the process runs inside AWS Lambda: its runtime
// API address is set.
func inLambda(getenv func(string) string) bool {
	return getenv("AWS_LAMBDA_RUNTIME_API") != ""
}

// validateLambda checks what Lambda mode needs beyond Config.Validate:
// every instance of the function must share the leases, the relay state,
// the checkpoints and the API keys, and nothing on an instance's disk
// outlives it.
func validateLambda(cfg Config, relayBroker string) error {
	switch {
	case cfg.Store != "dynamodb":
		return fmt.Errorf("QUARRY_STORE: %q in AWS Lambda; want dynamodb (each function instance would have its own embedded store)", cfg.Store)
	case relayBroker != "dynamodb":
		return fmt.Errorf("QUARRY_RELAY_BROKER: %q in AWS Lambda; want dynamodb (instances must share the relay)", relayBroker)
	case len(cfg.APIKeys) == 0:
		return errors.New("QUARRY_API_KEYS: required in AWS Lambda (a generated key would differ on every instance)")
	case cfg.CheckpointConfig.WithDefaults().Store != checkpoints.StoreS3:
		return fmt.Errorf("QUARRY_CHECKPOINT_STORE: %q in AWS Lambda; want %s (each function instance would have its own embedded checkpoints)",
			cfg.CheckpointConfig.WithDefaults().Store, checkpoints.StoreS3)
	}
	return nil
}

// runLambda serves AWS Lambda invocations (lambdaHandler.Invoke) until the
// runtime ends the process. The stack is built once per instance (the
// cold start) with no background loops: the warm pool's background work
// runs on scheduled invocations.
func runLambda(ctx context.Context, cfg Config, log *slog.Logger) error {
	var rc RelayConfig
	if err := envconfig.Process("", &rc); err != nil {
		return fmt.Errorf("read QUARRY_RELAY_* configuration: %w", err)
	}
	if err := validateLambda(cfg, rc.Broker); err != nil {
		return err
	}
	h, closeFn, err := newLambdaHandler(ctx, cfg, log)
	if err != nil {
		return err
	}
	log.Info("serving AWS Lambda invocations", "replica", cfg.ReplicaID)
	// StartWithOptions returns only by exiting the process; on SIGTERM
	// (delivered when the function has an extension) the stack closes
	// first. Sandboxes and leases are not touched either way.
	lambda.StartWithOptions(h.Invoke, lambda.WithContext(ctx),
		lambda.WithEnableSIGTERM(func() { closeFn(context.WithoutCancel(ctx)) }))
	return nil
}

// lambdaHandler adapts Lambda invocations to the gateway: HTTP events (API
// Gateway HTTP API payload 2.0, Lambda Function URLs) go through the same
// fiber app as the HTTP server; scheduled events (EventBridge) run one
// background pass. It is used by one invocation at a time (the Lambda
// runtime's contract) but is safe for concurrent use.
type lambdaHandler struct {
	handler fasthttp.RequestHandler
	mgr     *warmpool.Manager
	purge   *purger // one pass of expired checkpoints per scheduled invocation
	log     *slog.Logger
}

// newLambdaHandler builds the stack without background loops and the
// handler on it; the returned function tears the stack down.
func newLambdaHandler(ctx context.Context, cfg Config, log *slog.Logger) (*lambdaHandler, func(context.Context), error) {
	st, err := build(ctx, cfg, log, providerMakers(), false)
	if err != nil {
		return nil, nil, err
	}
	return &lambdaHandler{handler: st.gw.App().Handler(), mgr: st.mgr, purge: st.purge, log: log}, st.close, nil
}

// lambdaEvent holds the fields that tell the kinds of invocation apart.
type lambdaEvent struct {
	RequestContext struct {
		HTTP *struct {
			Method string `json:"method"`
		} `json:"http"`
	} `json:"requestContext"`
	Source     string `json:"source"`
	DetailType string `json:"detail-type"`
	// Quarry is the constant input of a schedule that is no EventBridge
	// rule (an EventBridge Scheduler target): {"quarry": "reconcile"}.
	Quarry string `json:"quarry"`
}

// reconcileResult is the answer of a scheduled invocation.
type reconcileResult struct {
	Reconciled bool   `json:"reconciled"`
	Elapsed    string `json:"elapsed"`
}

// Invoke serves one invocation: an HTTP event gets the gateway's answer (an
// events.APIGatewayV2HTTPResponse; its shape is also a Function URL's), a
// schedule runs Manager.RunOnce. An event of another kind is an error.
func (h *lambdaHandler) Invoke(ctx context.Context, payload json.RawMessage) (any, error) {
	var ev lambdaEvent
	if err := json.Unmarshal(payload, &ev); err != nil {
		return nil, fmt.Errorf("decode invocation event: %w", err)
	}
	switch {
	case ev.RequestContext.HTTP != nil:
		var req events.APIGatewayV2HTTPRequest
		if err := json.Unmarshal(payload, &req); err != nil {
			return nil, fmt.Errorf("decode HTTP event: %w", err)
		}
		return h.serveHTTP(ctx, req), nil
	case ev.Source == "aws.events" && ev.DetailType == "Scheduled Event", ev.Quarry == "reconcile":
		return h.reconcile(ctx)
	default:
		return nil, errors.New("invocation event: neither an HTTP event (requestContext.http) nor a schedule (source aws.events, or {\"quarry\": \"reconcile\"})")
	}
}

// reconcile runs the warm pool's background work once, then one purge pass
// of expired checkpoints, bounded by the invocation's deadline less a
// margin to answer in.
func (h *lambdaHandler) reconcile(ctx context.Context) (reconcileResult, error) {
	start := time.Now()
	var cancel context.CancelFunc
	if dl, ok := ctx.Deadline(); ok {
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-2*time.Second))
	} else {
		ctx, cancel = context.WithTimeout(ctx, defaultReconcileTimeout)
	}
	defer cancel()
	if err := h.mgr.RunOnce(ctx); err != nil {
		return reconcileResult{}, err
	}
	if h.purge != nil {
		h.purge.pass(ctx) // its failures are logged and counted; the next schedule retries
	}
	elapsed := time.Since(start).Round(time.Millisecond)
	h.log.Info("scheduled background pass done", "elapsed", elapsed)
	return reconcileResult{Reconciled: true, Elapsed: elapsed.String()}, nil
}

// serveHTTP runs one HTTP event through the gateway and returns its whole
// answer. A streamed answer (an exec's SSE stream, a download) is read to
// its end: it arrives at once when the command is done. An answer too large
// for a Lambda response becomes a 502 in the gateway's error shape.
func (h *lambdaHandler) serveHTTP(ctx context.Context, ev events.APIGatewayV2HTTPRequest) events.APIGatewayV2HTTPResponse {
	var req fasthttp.Request
	if err := toFastHTTP(ev, &req); err != nil {
		return errorResponse(http.StatusBadRequest, agentapi.CodeBadRequest, err.Error())
	}
	var fctx fasthttp.RequestCtx
	fctx.Init(&req, sourceAddr(ev.RequestContext.HTTP.SourceIP), nil)
	h.handler(&fctx)
	resp, err := fromFastHTTP(&fctx.Response)
	if err != nil {
		h.log.Warn("lambda: answer not deliverable", "method", ev.RequestContext.HTTP.Method, "path", ev.RawPath, "err", err)
		return errorResponse(http.StatusBadGateway, agentapi.CodeTooLarge, err.Error())
	}
	if ctx.Err() != nil {
		h.log.Warn("lambda: invocation deadline passed while serving", "path", ev.RawPath)
	}
	return resp
}

// toFastHTTP fills req from an HTTP API payload 2.0 event (a Function URL
// event has the same shape): method, raw path and query, headers (2.0
// joins repeated headers with commas, which HTTP allows), cookies (2.0
// moves them out of the headers) and the body, base64-decoded when the
// event says so.
func toFastHTTP(ev events.APIGatewayV2HTTPRequest, req *fasthttp.Request) error {
	method := ev.RequestContext.HTTP.Method
	if method == "" {
		return errors.New("requestContext.http.method: empty")
	}
	path := ev.RawPath
	if path == "" {
		path = ev.RequestContext.HTTP.Path
	}
	if !strings.HasPrefix(path, "/") {
		return fmt.Errorf("rawPath: %q does not start with /", path)
	}
	uri := path
	if ev.RawQueryString != "" {
		uri += "?" + ev.RawQueryString
	}
	req.Header.SetMethod(method)
	req.SetRequestURI(uri)
	for k, v := range ev.Headers {
		req.Header.Set(k, v)
	}
	if len(ev.Cookies) > 0 {
		req.Header.Set("Cookie", strings.Join(ev.Cookies, "; "))
	}
	if len(req.Header.Host()) == 0 && ev.RequestContext.DomainName != "" {
		req.Header.SetHost(ev.RequestContext.DomainName)
	}
	body := []byte(ev.Body)
	if ev.IsBase64Encoded {
		var err error
		if body, err = base64.StdEncoding.DecodeString(ev.Body); err != nil {
			return fmt.Errorf("body: not valid base64 (isBase64Encoded is true): %w", err)
		}
	}
	req.Header.Del("Transfer-Encoding") // a chunked request arrives whole
	req.SetBody(body)
	req.Header.SetContentLength(len(body))
	return nil
}

// fromFastHTTP converts the gateway's answer: headers (repeated ones joined
// with commas, Set-Cookie moved to cookies) and the body, read to its end
// when streamed (at most maxLambdaBody) and base64-encoded unless it is
// UTF-8 text.
func fromFastHTTP(resp *fasthttp.Response) (events.APIGatewayV2HTTPResponse, error) {
	out := events.APIGatewayV2HTTPResponse{StatusCode: resp.StatusCode(), Headers: map[string]string{}}
	var body []byte
	if resp.IsBodyStream() {
		b, err := io.ReadAll(io.LimitReader(resp.BodyStream(), maxLambdaBody+1))
		_ = resp.CloseBodyStream() // stops the writer of a stream cut short
		if err != nil {
			return out, fmt.Errorf("read streamed answer: %w", err)
		}
		body = b
	} else {
		body = resp.Body()
	}
	if len(body) > maxLambdaBody {
		return out, fmt.Errorf("the answer exceeds AWS Lambda's %d-byte response limit; use the gateway as an ECS service for large downloads and long streams (docs/DEPLOY.md)", maxLambdaPayload)
	}
	resp.Header.VisitAll(func(k, v []byte) {
		name := string(k)
		switch {
		case strings.EqualFold(name, "Set-Cookie"):
			out.Cookies = append(out.Cookies, string(v))
		case strings.EqualFold(name, "Content-Length"), strings.EqualFold(name, "Transfer-Encoding"):
			// API Gateway computes the length of the whole body.
		case out.Headers[name] != "":
			out.Headers[name] += ", " + string(v)
		default:
			out.Headers[name] = string(v)
		}
	})
	if isText(string(resp.Header.ContentType()), body) {
		out.Body = string(body)
		return out, nil
	}
	out.Body, out.IsBase64Encoded = base64.StdEncoding.EncodeToString(body), true
	if len(out.Body) > maxLambdaBody {
		return out, fmt.Errorf("the answer (base64-encoded) exceeds AWS Lambda's %d-byte response limit; use the gateway as an ECS service for large downloads (docs/DEPLOY.md)", maxLambdaPayload)
	}
	return out, nil
}

// isText reports whether a body of this content type may travel as a JSON
// string unchanged: textual types whose bytes are valid UTF-8.
func isText(contentType string, body []byte) bool {
	if len(body) == 0 {
		return true
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	textual := strings.HasPrefix(mt, "text/") || mt == "application/json" || strings.HasSuffix(mt, "+json") ||
		mt == "application/x-ndjson" || mt == "application/xml" || mt == "application/yaml"
	return textual && utf8.Valid(body)
}

// errorResponse is an answer in the gateway's error shape.
func errorResponse(status int, code, message string) events.APIGatewayV2HTTPResponse {
	var b bytes.Buffer
	_ = json.NewEncoder(&b).Encode(map[string]any{"error": map[string]string{"code": code, "message": message}})
	return events.APIGatewayV2HTTPResponse{
		StatusCode: status,
		Headers:    map[string]string{"Content-Type": "application/json"},
		Body:       b.String(),
	}
}

// sourceAddr is the client's address for the gateway's logs.
func sourceAddr(ip string) net.Addr {
	parsed := net.ParseIP(ip)
	if parsed == nil {
		return nil
	}
	return &net.TCPAddr{IP: parsed}
}
