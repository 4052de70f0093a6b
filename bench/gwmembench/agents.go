package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quarryhq/quarry/bench/gwmembench/farm"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

// agentAddr is the loopback address of farm endpoint i: 127.<b>.<i/250>.<i%250+1>
// on one port. Every address of 127.0.0.0/8 is loopback, so endpoints need
// no port each (10,000 listeners on 127.0.0.1 would take a third of the
// ephemeral ports).
func agentAddr(base byte, i, port int) (string, error) {
	if i < 0 || i >= 250*256 {
		return "", fmt.Errorf("endpoint %d: at most %d", i, 250*256)
	}
	ip := net.IPv4(127, base, byte(i/250), byte(i%250+1))
	if !ip.IsLoopback() {
		return "", fmt.Errorf("endpoint %d: %s is not loopback", i, ip)
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(port)), nil
}

// endpoint is one fake agent: its token and the lease it was given.
type endpoint struct {
	token string

	mu    sync.Mutex
	lease string
	gen   int64
}

// agentFarm serves the agent protocol for many endpoints, for the calls a
// gateway makes of a leased sandbox: /healthz, /v1/init, /v1/exec (an
// answer of a fixed size) and DELETE /v1/calls/{id}. Tokens and
// generations are checked as the real agent checks them.
type agentFarm struct {
	byAddr map[string]*endpoint
	answer []byte // the /v1/exec answer
}

func newAgentFarm(answerBytes int) (*agentFarm, error) {
	answer, err := json.Marshal(agentapi.ExecResult{Stdout: strings.Repeat("x", answerBytes), DurationMS: 1})
	if err != nil {
		return nil, err
	}
	return &agentFarm{byAddr: make(map[string]*endpoint), answer: answer}, nil
}

// runAgents is the agents role: it listens on count endpoints from first
// on, prints each as a JSON farm.Endpoint line and then "ready", and serves
// until ctx ends.
func runAgents(ctx context.Context, o options) error {
	f, err := newAgentFarm(o.answerBytes)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: f, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 10 * time.Minute}
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	enc := json.NewEncoder(os.Stdout)
	for i := o.first; i < o.first+o.count; i++ {
		addr, err := agentAddr(byte(o.addrBase), i, o.agentPort)
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", addr, err)
		}
		lns = append(lns, ln)
		tok := make([]byte, 16)
		_, _ = rand.Read(tok)
		ep := &endpoint{token: hex.EncodeToString(tok)}
		f.byAddr[ln.Addr().String()] = ep
		if err := enc.Encode(farm.Endpoint{URL: "http://" + ln.Addr().String(), Token: ep.token}); err != nil {
			return err
		}
	}
	for _, ln := range lns {
		go func() { _ = srv.Serve(ln) }()
	}
	fmt.Println("ready")
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

func (f *agentFarm) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	la, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	var ep *endpoint
	if la != nil {
		ep = f.byAddr[la.String()]
	}
	if ep == nil {
		agentError(w, http.StatusNotFound, "not_found", "no such endpoint")
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+ep.token {
		agentError(w, http.StatusUnauthorized, "unauthorized", "bad token")
		return
	}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == agentapi.RouteHealth:
		writeJSON(w, http.StatusOK, ep.health())
	case r.Method == http.MethodPost && r.URL.Path == agentapi.RouteInit:
		var req agentapi.InitRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			agentError(w, http.StatusBadRequest, "bad_request", err.Error())
			return
		}
		ep.mu.Lock()
		stale := req.Generation < ep.gen
		if !stale {
			ep.lease, ep.gen = req.LeaseID, req.Generation
		}
		ep.mu.Unlock()
		if stale {
			agentError(w, http.StatusConflict, agentapi.CodeStaleGeneration, "stale generation")
			return
		}
		writeJSON(w, http.StatusOK, ep.health())
	case r.Method == http.MethodPost && r.URL.Path == agentapi.RouteExec:
		_, _ = io.Copy(io.Discard, r.Body)
		gen, _ := strconv.ParseInt(r.Header.Get(agentapi.HeaderGeneration), 10, 64)
		ep.mu.Lock()
		stale := gen < ep.gen
		ep.mu.Unlock()
		if stale {
			agentError(w, http.StatusConflict, agentapi.CodeStaleGeneration, "stale generation")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(f.answer)))
		_, _ = w.Write(f.answer)
	case r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, "/v1/calls/"):
		w.WriteHeader(http.StatusNoContent)
	default:
		agentError(w, http.StatusNotFound, "not_found", "the farm serves /healthz, /v1/init, /v1/exec and /v1/calls only")
	}
}

func (ep *endpoint) health() agentapi.Health {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return agentapi.Health{Status: "ok", Version: agentapi.Version, LeaseID: ep.lease, Generation: ep.gen}
}

func agentError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, agentapi.ErrorBody{Error: agentapi.ErrorDetail{Code: code, Message: msg}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
