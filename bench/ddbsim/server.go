package ddbsim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/quarryhq/quarry/internal/clock"
	"github.com/quarryhq/quarry/internal/defaults"
)

// Defaults of Config.
const (
	DefaultRegion    = "us-east-1"
	DefaultAccountID = "000000000000"
	// DefaultIndexLag is how long a write takes to reach the global
	// indexes (simulated): small, but never zero, as on AWS.
	DefaultIndexLag = 10 * time.Millisecond
	// DefaultPartitionReadUnits and DefaultPartitionWriteUnits are
	// DynamoDB's per-partition limits, per partition key value here.
	DefaultPartitionReadUnits  = 3000
	DefaultPartitionWriteUnits = 1000
	// DefaultTableUnits is the default per-table quota of an on-demand
	// table (reads and writes each, per second).
	DefaultTableUnits = 40000
)

// maxBody bounds a request body (DynamoDB: 16 MB for batches).
const maxBody = 17 << 20

// Config sets what the simulator simulates. Zero fields take the defaults
// noted on each.
type Config struct {
	// Region and AccountID appear in ARNs (us-east-1, 000000000000).
	Region    string
	AccountID string
	// IndexLag is how long after a write global indexes show it
	// (DefaultIndexLag); a negative value makes them current at once.
	IndexLag time.Duration
	// PartitionReadUnits and PartitionWriteUnits are the capacity units per
	// second one partition key value of a table or index may consume
	// (DynamoDB's per-partition limits, 3,000 and 1,000); negative: no limit.
	PartitionReadUnits  float64
	PartitionWriteUnits float64
	// TableReadUnits and TableWriteUnits are each table's quota per second
	// (40,000 each, DynamoDB's default for on-demand tables; a table's own
	// OnDemandThroughput lowers it); negative: no limit.
	TableReadUnits  float64
	TableWriteUnits float64
	// TableCreateDelay is how long a new table stays CREATING (0: it is
	// ACTIVE at once, though CreateTable answers CREATING, as on AWS).
	TableCreateDelay time.Duration
	// Clock tells the time (nil: clock.System). Tests pass a fake.
	Clock clock.Clock
	// Log receives one line per throttled request, naming the limit
	// (nil: discarded).
	Log *slog.Logger
}

// WithDefaults returns c with its zero fields set to the defaults.
func (c Config) WithDefaults() Config {
	defaults.Set(&c.Region, DefaultRegion)
	defaults.Set(&c.AccountID, DefaultAccountID)
	defaults.Set(&c.IndexLag, DefaultIndexLag)
	defaults.Set(&c.PartitionReadUnits, DefaultPartitionReadUnits)
	defaults.Set(&c.PartitionWriteUnits, DefaultPartitionWriteUnits)
	defaults.Set(&c.TableReadUnits, DefaultTableUnits)
	defaults.Set(&c.TableWriteUnits, DefaultTableUnits)
	if c.Clock == nil {
		c.Clock = clock.System{}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// Server is the simulator: an http.Handler speaking DynamoDB's JSON
// protocol. Every operation runs under one mutex (decoding and encoding
// run outside it), so each request is atomic. Safe for concurrent use.
type Server struct {
	cfg Config

	mu     sync.Mutex
	tables map[string]*table
	tokens tokenCache
	units  unitTotals
	logged map[string]time.Time // when each throttling limit was last logged

	ops   map[string]*opCounters
	reqID atomic.Int64

	lmu  sync.Mutex
	srv  *fasthttp.Server
	ln   *trackedListener
	done chan struct{}
}

// New returns a simulator with no tables.
func New(cfg Config) *Server {
	s := &Server{cfg: cfg.WithDefaults(), tables: map[string]*table{}, ops: map[string]*opCounters{}}
	for _, name := range operationNames {
		s.ops[name] = &opCounters{}
	}
	s.ops[opOther] = &opCounters{}
	return s
}

// opOther counts requests for operations the simulator does not serve.
const opOther = "other"

// handler serves one operation: it decodes the body itself and returns
// the answer to encode (run without the mutex; see Server.locked).
type handler func(s *Server, body []byte) (any, *apiError)

// operationNames are the operations served, by X-Amz-Target name.
var operationNames = []string{
	"BatchGetItem", "BatchWriteItem", "CreateTable", "DeleteItem", "DeleteTable", "DescribeTable", "DescribeTimeToLive",
	"GetItem", "ListTables", "PutItem", "Query", "Scan", "TransactGetItems", "TransactWriteItems", "UpdateItem", "UpdateTimeToLive",
}

// handlerOf returns the handler of operation name, nil when not served.
func handlerOf(name string) handler {
	switch name {
	case "CreateTable":
		return (*Server).createTable
	case "DescribeTable":
		return (*Server).describeTable
	case "DeleteTable":
		return (*Server).deleteTable
	case "ListTables":
		return (*Server).listTables
	case "UpdateTimeToLive":
		return (*Server).updateTTL
	case "DescribeTimeToLive":
		return (*Server).describeTTL
	case "GetItem":
		return (*Server).getItem
	case "PutItem":
		return (*Server).putItem
	case "UpdateItem":
		return (*Server).updateItem
	case "DeleteItem":
		return (*Server).deleteItem
	case "Query":
		return (*Server).query
	case "Scan":
		return (*Server).scan
	case "BatchGetItem":
		return (*Server).batchGetItem
	case "BatchWriteItem":
		return (*Server).batchWriteItem
	case "TransactWriteItems":
		return (*Server).transactWriteItems
	case "TransactGetItems":
		return (*Server).transactGetItems
	}
	return nil
}

// locked runs fn under the simulator's mutex.
func (s *Server) locked(fn func(now time.Time) *apiError) *apiError {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fn(s.cfg.Clock.Now())
}

// decode parses a request body into in, refusing parameters the
// simulator does not know (DynamoDB would act on them; ignoring one would
// be wrong silently).
func decode(body []byte, in any) *apiError {
	d := json.NewDecoder(bytes.NewReader(body))
	d.DisallowUnknownFields()
	if err := d.Decode(in); err != nil {
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) {
			return newError(codeSerialization, http.StatusBadRequest, "Unexpected value type in payload: %s", ute.Field)
		}
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return validation("ddbsim (a simulator of DynamoDB) does not simulate the parameter %s", f)
		}
		return newError(codeSerialization, http.StatusBadRequest, "%s", err.Error())
	}
	return nil
}

// statsPath answers GET with Stats as JSON.
const statsPath = "/ddbsim/stats"

// ServeHTTP implements http.Handler: POST / with X-Amz-Target
// DynamoDB_20120810.<Operation>, and GET /ddbsim/stats (Stats as JSON).
// Start serves the same with fasthttp.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == statsPath {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.Stats())
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	status, out := s.handle(r.Method == http.MethodPost, r.Header.Get("X-Amz-Target"), body, err)
	h := w.Header()
	for k, v := range s.headers(out) {
		h.Set(k, v)
	}
	w.WriteHeader(status)
	_, _ = w.Write(out)
}

func (s *Server) serveFast(ctx *fasthttp.RequestCtx) {
	if ctx.IsGet() && string(ctx.Path()) == statsPath {
		ctx.SetContentType("application/json")
		_ = json.NewEncoder(ctx).Encode(s.Stats())
		return
	}
	status, out := s.handle(ctx.IsPost(), string(ctx.Request.Header.Peek("X-Amz-Target")), ctx.PostBody(), nil)
	for k, v := range s.headers(out) {
		ctx.Response.Header.Set(k, v)
	}
	ctx.SetStatusCode(status)
	ctx.SetBody(out)
}

// handle answers one request: its status and body.
func (s *Server) handle(post bool, target string, body []byte, readErr error) (int, []byte) {
	name, ok := strings.CutPrefix(target, "DynamoDB_20120810.")
	h := handlerOf(name)
	if !post || !ok || h == nil {
		s.ops[opOther].requests.Add(1)
		return s.reply(opOther, nil, newError(codeUnknownOperation, http.StatusBadRequest, "ddbsim (a simulator of DynamoDB) does not serve %q", target))
	}
	s.ops[name].requests.Add(1)
	if readErr != nil {
		return s.reply(name, nil, newError(codeSerialization, http.StatusBadRequest, "read the request: %s", readErr.Error()))
	}
	if len(body) > maxBody {
		return s.reply(name, nil, validation("Request size exceeded %d bytes", maxBody))
	}
	out, aerr := h(s, body)
	return s.reply(name, out, aerr)
}

func (s *Server) reply(op string, out any, aerr *apiError) (int, []byte) {
	if aerr != nil {
		c := s.ops[op]
		c.errors.Add(1)
		if aerr.code == codeThroughput || aerr.code == codeThrottling {
			c.throttled.Add(1)
		}
		return aerr.status, aerr.body()
	}
	body, err := json.Marshal(out)
	if err != nil {
		return http.StatusInternalServerError, newError(codeInternal, http.StatusInternalServerError, "encode the answer: %s", err.Error()).body()
	}
	return http.StatusOK, body
}

// headers are an answer's headers: its type, its CRC32 (the SDK checks
// it) and a request id.
func (s *Server) headers(body []byte) map[string]string {
	return map[string]string{
		"Content-Type":     "application/x-amz-json-1.0",
		"X-Amz-Crc32":      strconv.FormatUint(uint64(crc32.ChecksumIEEE(body)), 10),
		"X-Amzn-Requestid": "ddbsim-" + strconv.FormatInt(s.reqID.Add(1), 10),
	}
}

// Start serves the simulator on addr, which must be a loopback address
// ("127.0.0.1:0" picks a port), until Close. It returns the endpoint URL
// to give the SDK (AWS_ENDPOINT_URL, or Client).
func (s *Server) Start(addr string) (string, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("start DynamoDB simulator: %w", err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return "", fmt.Errorf("start DynamoDB simulator: %q is not a loopback address; the simulator listens on 127.0.0.1 only", addr)
	}
	s.lmu.Lock()
	defer s.lmu.Unlock()
	if s.srv != nil {
		return "", errors.New("start DynamoDB simulator: already started")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("start DynamoDB simulator: %w", err)
	}
	s.ln, s.done = &trackedListener{Listener: ln, conns: map[net.Conn]struct{}{}}, make(chan struct{})
	s.srv = &fasthttp.Server{Handler: s.serveFast, Name: "ddbsim", MaxRequestBodySize: maxBody + 1,
		ReadTimeout: 2 * time.Minute, IdleTimeout: 2 * time.Minute, NoDefaultDate: true}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(s.ln) // returns when Close shuts the listener
	}()
	return "http://" + ln.Addr().String(), nil
}

// Close stops serving (bounded by ctx) and waits for the server's
// goroutine. Closing a simulator never started, or twice, returns nil.
func (s *Server) Close(ctx context.Context) error {
	s.lmu.Lock()
	srv, done := s.srv, s.done
	s.srv = nil
	s.lmu.Unlock()
	if srv == nil {
		return nil
	}
	// Clients keep idle connections open, and fasthttp's shutdown waits
	// for them: close them first (a request in flight is cut short).
	s.ln.closeConns()
	err := srv.ShutdownWithContext(ctx)
	<-done
	if err != nil {
		return fmt.Errorf("close DynamoDB simulator: %w", err)
	}
	return nil
}

// trackedListener remembers the connections it accepted, so that Close
// can end them; after closeConns it refuses new ones.
type trackedListener struct {
	net.Listener
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func (l *trackedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		_ = c.Close()
		return nil, net.ErrClosed
	}
	tc := &trackedConn{Conn: c, l: l}
	l.conns[tc] = struct{}{}
	return tc, nil
}

func (l *trackedListener) closeConns() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	for c := range l.conns {
		_ = c.(*trackedConn).Conn.Close()
	}
	clear(l.conns)
}

type trackedConn struct {
	net.Conn
	l *trackedListener
}

func (c *trackedConn) Close() error {
	c.l.mu.Lock()
	delete(c.l.conns, c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// --- stats ---

type opCounters struct {
	requests, errors, throttled atomic.Int64
}

// unitTotals are the capacity units consumed, by table (under Server.mu).
type unitTotals struct {
	read, write map[string]float64
}

func (u *unitTotals) add(tableName string, read, write float64) {
	if u.read == nil {
		u.read, u.write = map[string]float64{}, map[string]float64{}
	}
	u.read[tableName] += read
	u.write[tableName] += write
}

// Stats are the simulator's counters since New (simulated figures).
type Stats struct {
	// Simulated is always true: these are a simulator's counts, not
	// DynamoDB's.
	Simulated bool `json:"simulated"`
	// Operations holds, by operation name, the requests, the error answers
	// among them and the throttled ones among those. "other" counts
	// requests for operations the simulator does not serve.
	Operations map[string]OpStats `json:"operations"`
	// ReadUnits and WriteUnits are the read and write request units
	// consumed, by table (indexes included): the on-demand bill.
	ReadUnits  map[string]float64 `json:"read_units"`
	WriteUnits map[string]float64 `json:"write_units"`
}

// OpStats counts one operation's requests.
type OpStats struct {
	Requests  int64 `json:"requests"`
	Errors    int64 `json:"errors"`
	Throttled int64 `json:"throttled"`
}

// Stats returns the counters. Safe for concurrent use.
func (s *Server) Stats() Stats {
	st := Stats{Simulated: true, Operations: map[string]OpStats{}, ReadUnits: map[string]float64{}, WriteUnits: map[string]float64{}}
	for name, c := range s.ops {
		st.Operations[name] = OpStats{Requests: c.requests.Load(), Errors: c.errors.Load(), Throttled: c.throttled.Load()}
	}
	s.mu.Lock()
	for k, v := range s.units.read {
		st.ReadUnits[k] = v
	}
	for k, v := range s.units.write {
		st.WriteUnits[k] = v
	}
	s.mu.Unlock()
	return st
}

// Operations returns the names of the operations the simulator serves.
func Operations() []string { return slices.Clone(operationNames) }
