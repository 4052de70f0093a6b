package main

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
)

// fakeFile is one entry of the fake sandbox's file system.
type fakeFile struct {
	data []byte
	mode fs.FileMode // permission bits
	dir  bool
	link string // symlink target
}

// sseWriter writes server-sent events, flushing each. Like the agent, it
// writes the Data of stdout/stderr chunks in the request's encoding.
type sseWriter struct {
	w   http.ResponseWriter
	enc string
}

func (s sseWriter) event(name string, v any) {
	if c, ok := v.(agentapi.StreamChunk); ok && (name == agentapi.EventStdout || name == agentapi.EventStderr) {
		c.Data = agentapi.EncodeOutput(s.enc, []byte(c.Data))
		v = c
	}
	b, _ := json.Marshal(v)
	fmt.Fprintf(s.w, "event: %s\ndata: %s\n\n", name, b)
	_ = http.NewResponseController(s.w).Flush()
}

func (s sseWriter) keepAlive() {
	_, _ = io.WriteString(s.w, ": keep-alive\n\n")
	_ = http.NewResponseController(s.w).Flush()
}

// fakeGateway implements the routes of docs/API.md the CLI calls, over one
// in-memory file system shared by all sandboxes. exec and run script the
// commands; the rest records what was asked.
type fakeGateway struct {
	url, key string
	// exec streams the events of one exec; nil answers exit 0 without output.
	exec func(w sseWriter, req agentapi.ExecRequest)
	// run answers one session run; nil answers exit 0 without output.
	run func(command string) agentapi.SessionRunResult

	mu             sync.Mutex
	sandboxes      []client.Sandbox
	idempotency    []string // Idempotency-Key of each create
	execs          []agentapi.ExecRequest
	runs           []agentapi.SessionRunRequest
	sessions       map[string]bool // open sessions
	closedSessions []string
	killAlls       []string            // sandboxes of each kill-all
	files          map[string]fakeFile // by absolute path
}

// fakeWorkdir is the fake sandbox's working directory.
const fakeWorkdir = "/home/user"

func newFakeGateway(t *testing.T) *fakeGateway {
	t.Helper()
	f := &fakeGateway{key: "k-test", sessions: map[string]bool{}, files: map[string]fakeFile{}}
	f.put(fakeWorkdir, fakeFile{dir: true, mode: 0o755})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", f.create)
	mux.HandleFunc("GET /v1/sandboxes", f.list)
	mux.HandleFunc("GET /v1/sandboxes/{id}", f.sandbox(func(w http.ResponseWriter, r *http.Request, sb *client.Sandbox) {}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/heartbeat", f.active(func(w http.ResponseWriter, r *http.Request, sb *client.Sandbox) {
		sb.ExpiresAt = sb.ExpiresAt.Add(time.Duration(sb.LeaseSeconds) * time.Second)
	}))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", f.active(func(w http.ResponseWriter, r *http.Request, sb *client.Sandbox) {
		sb.State = client.StateReleased
	}))
	mux.HandleFunc("GET /v1/pools", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"pools": []client.Pool{
			{Name: "gpu", Provider: "ecs", MinWarm: 0, MaxTotal: 2, Leased: 1},
			{Name: "default", Provider: "process", MinWarm: 2, MaxTotal: 8, Ready: 2, Launching: 1, Leased: 3},
		}})
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", f.agent(f.execRoute))
	mux.HandleFunc("POST /v1/sandboxes/{id}/sessions", f.agent(f.createSession))
	mux.HandleFunc("POST /v1/sandboxes/{id}/sessions/{sid}/run", f.agent(f.runSession))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/sessions/{sid}", f.agent(f.closeSession))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", f.agent(f.readFile))
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", f.agent(f.writeFile))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/stat", f.agent(f.stat))
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files/archive", f.agent(f.putArchive))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/archive", f.agent(f.getArchive))
	mux.HandleFunc("POST /v1/sandboxes/{id}/kill-all", f.agent(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.killAlls = append(f.killAlls, r.PathValue("id"))
		f.mu.Unlock()
		writeJSON(w, http.StatusOK, agentapi.KillAllResult{Killed: 201, Threads: 233, DurationMS: 37})
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+f.key {
			writeError(w, http.StatusUnauthorized, agentapi.CodeUnauthorized, "missing or wrong API key")
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, agentapi.ErrorBody{Error: agentapi.ErrorDetail{Code: code, Message: msg}})
}

// decodeBody decodes the JSON body of r, or answers 400.
func decodeBody[T any](w http.ResponseWriter, r *http.Request) (T, bool) {
	var v T
	if err := json.NewDecoder(r.Body).Decode(&v); err != nil {
		writeError(w, http.StatusBadRequest, agentapi.CodeBadRequest, "body: "+err.Error())
		return v, false
	}
	return v, true
}

func (f *fakeGateway) create(w http.ResponseWriter, r *http.Request) {
	req, ok := decodeBody[client.CreateSandboxRequest](w, r)
	if !ok {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	created := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	lease := req.LeaseSeconds
	if lease == 0 {
		lease = 600
	}
	sb := client.Sandbox{ID: fmt.Sprintf("sbx-%d", len(f.sandboxes)+1), Pool: req.Pool, State: client.StateActive,
		Generation: 1, CreatedAt: created, ExpiresAt: created.Add(time.Duration(lease) * time.Second),
		LeaseSeconds: lease, Labels: req.Labels}
	f.sandboxes = append(f.sandboxes, sb)
	f.idempotency = append(f.idempotency, r.Header.Get("Idempotency-Key"))
	writeJSON(w, http.StatusCreated, sb)
}

func (f *fakeGateway) list(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	q := r.URL.Query()
	out := []client.Sandbox{}
	for _, sb := range f.sandboxes {
		keep := (q.Get("pool") == "" || q.Get("pool") == sb.Pool) && (q.Get("state") == "" || q.Get("state") == sb.State)
		for _, l := range q["label"] {
			k, v, _ := strings.Cut(l, "=")
			keep = keep && sb.Labels[k] == v
		}
		if keep {
			out = append(out, sb)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
}

// find returns the index of sandbox id, or -1; f.mu must be held.
func (f *fakeGateway) find(id string) int {
	return slices.IndexFunc(f.sandboxes, func(sb client.Sandbox) bool { return sb.ID == id })
}

// refuse answers 404 for an unknown sandbox and, when active is asked
// for, 410 for an ended one; it reports whether it answered.
func (f *fakeGateway) refuse(w http.ResponseWriter, id string, active bool) bool {
	f.mu.Lock()
	i := f.find(id)
	ended := i >= 0 && f.sandboxes[i].State != client.StateActive
	f.mu.Unlock()
	switch {
	case i < 0:
		writeError(w, http.StatusNotFound, agentapi.CodeNotFound, "sandbox "+id+" not found")
	case active && ended:
		writeError(w, http.StatusGone, agentapi.CodeGone, "sandbox "+id+" was released")
	default:
		return false
	}
	return true
}

// sandbox serves a route on one sandbox; h may change it, and the sandbox
// is the answer.
func (f *fakeGateway) sandbox(h func(w http.ResponseWriter, r *http.Request, sb *client.Sandbox)) http.HandlerFunc {
	return f.onSandbox(false, h)
}

// active is sandbox for routes that need an active lease.
func (f *fakeGateway) active(h func(w http.ResponseWriter, r *http.Request, sb *client.Sandbox)) http.HandlerFunc {
	return f.onSandbox(true, h)
}

func (f *fakeGateway) onSandbox(active bool, h func(w http.ResponseWriter, r *http.Request, sb *client.Sandbox)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if f.refuse(w, r.PathValue("id"), active) {
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		sb := &f.sandboxes[f.find(r.PathValue("id"))]
		h(w, r, sb)
		writeJSON(w, http.StatusOK, *sb)
	}
}

// agent serves a proxied route of an active sandbox; h writes the answer
// and runs without f.mu held.
func (f *fakeGateway) agent(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !f.refuse(w, r.PathValue("id"), true) {
			h(w, r)
		}
	}
}

func (f *fakeGateway) execRoute(w http.ResponseWriter, r *http.Request) {
	req, ok := decodeBody[agentapi.ExecRequest](w, r)
	if !ok {
		return
	}
	f.mu.Lock()
	f.execs = append(f.execs, req)
	f.mu.Unlock()
	if r.Header.Get("Accept") != "text/event-stream" {
		writeError(w, http.StatusBadRequest, agentapi.CodeBadRequest, "the fake only streams")
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	sw := sseWriter{w: w, enc: req.Encoding}
	if f.exec == nil {
		sw.event(agentapi.EventExit, agentapi.ExecResult{})
		return
	}
	f.exec(sw, req)
}

func (f *fakeGateway) createSession(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := fmt.Sprintf("ses-%d", len(f.sessions)+len(f.closedSessions)+1)
	f.sessions[id] = true
	writeJSON(w, http.StatusOK, agentapi.SessionInfo{ID: id, Shell: "bash"})
}

func (f *fakeGateway) runSession(w http.ResponseWriter, r *http.Request) {
	req, ok := decodeBody[agentapi.SessionRunRequest](w, r)
	if !ok {
		return
	}
	sid := r.PathValue("sid")
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.sessions[sid] {
		writeError(w, http.StatusNotFound, agentapi.CodeNotFound, "session "+sid+" not found")
		return
	}
	f.runs = append(f.runs, req)
	var res agentapi.SessionRunResult
	if f.run != nil {
		res = f.run(req.Command)
	}
	if res.Closed {
		delete(f.sessions, sid)
	}
	writeJSON(w, http.StatusOK, res)
}

func (f *fakeGateway) closeSession(w http.ResponseWriter, r *http.Request) {
	sid := r.PathValue("sid")
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.sessions[sid] {
		writeError(w, http.StatusNotFound, agentapi.CodeNotFound, "session "+sid+" not found")
		return
	}
	delete(f.sessions, sid)
	f.closedSessions = append(f.closedSessions, sid)
	writeJSON(w, http.StatusOK, map[string]any{})
}

// abs is p made absolute against the fake working directory.
func abs(p string) string {
	if !path.IsAbs(p) {
		p = path.Join(fakeWorkdir, p)
	}
	return path.Clean(p)
}

// put stores file at p, creating its parents; f.mu must be held.
func (f *fakeGateway) put(p string, file fakeFile) {
	for d := path.Dir(p); d != "/"; d = path.Dir(d) {
		if _, ok := f.files[d]; !ok {
			f.files[d] = fakeFile{dir: true, mode: 0o755}
		}
	}
	f.files[p] = file
}

// lookup returns the entry at the request's ?path=, or answers 404.
func (f *fakeGateway) lookup(w http.ResponseWriter, r *http.Request) (string, fakeFile, bool) {
	p := abs(r.URL.Query().Get("path"))
	f.mu.Lock()
	file, ok := f.files[p]
	f.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, agentapi.CodeNotFound, p+": no such file or directory")
	}
	return p, file, ok
}

func (f *fakeGateway) readFile(w http.ResponseWriter, r *http.Request) {
	p, file, ok := f.lookup(w, r)
	switch {
	case !ok:
	case file.dir:
		writeError(w, http.StatusBadRequest, agentapi.CodeBadRequest, "path: "+p+" is a directory")
	default:
		_, _ = w.Write(file.data)
	}
}

func (f *fakeGateway) writeFile(w http.ResponseWriter, r *http.Request) {
	p := abs(r.URL.Query().Get("path"))
	mode, err := strconv.ParseUint(r.URL.Query().Get("mode"), 8, 32)
	if err != nil {
		mode = 0o644
	}
	data, err := io.ReadAll(r.Body)
	if err != nil {
		writeError(w, http.StatusBadRequest, agentapi.CodeBadRequest, "body: "+err.Error())
		return
	}
	f.mu.Lock()
	f.put(p, fakeFile{data: data, mode: fs.FileMode(mode)})
	f.mu.Unlock()
	writeJSON(w, http.StatusOK, agentapi.WriteResult{Path: p, Bytes: int64(len(data))})
}

func (f *fakeGateway) stat(w http.ResponseWriter, r *http.Request) {
	p, file, ok := f.lookup(w, r)
	if ok {
		writeJSON(w, http.StatusOK, agentapi.FileInfo{Name: path.Base(p), Path: p, Size: int64(len(file.data)),
			Mode: fmt.Sprintf("%04o", file.mode), IsDir: file.dir, Symlink: file.link})
	}
}

func (f *fakeGateway) putArchive(w http.ResponseWriter, r *http.Request) {
	dest := abs(r.URL.Query().Get("path"))
	res := agentapi.WriteResult{Path: dest}
	tr := tar.NewReader(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.files[dest]; !ok {
		f.put(dest, fakeFile{dir: true, mode: 0o755})
	}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, agentapi.CodeBadRequest, "body: "+err.Error())
			return
		}
		file := fakeFile{mode: fs.FileMode(h.Mode).Perm(), dir: h.Typeflag == tar.TypeDir, link: h.Linkname}
		if h.Typeflag == tar.TypeReg {
			file.data, _ = io.ReadAll(tr)
			res.Bytes += int64(len(file.data))
		}
		f.put(path.Join(dest, h.Name), file)
		res.Entries++
	}
	writeJSON(w, http.StatusOK, res)
}

func (f *fakeGateway) getArchive(w http.ResponseWriter, r *http.Request) {
	p, file, ok := f.lookup(w, r)
	if !ok {
		return
	}
	if !file.dir {
		writeError(w, http.StatusBadRequest, agentapi.CodeBadRequest, "path: "+p+" is not a directory")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	tw := tar.NewWriter(w)
	_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: int64(file.mode)})
	var names []string
	for name := range f.files {
		if strings.HasPrefix(name, p+"/") {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		e := f.files[name]
		h := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(name, p+"/"), Mode: int64(e.mode), Size: int64(len(e.data))}
		switch {
		case e.dir:
			h.Typeflag, h.Name, h.Size = tar.TypeDir, h.Name+"/", 0
		case e.link != "":
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, e.link, 0
		}
		_ = tw.WriteHeader(h)
		_, _ = tw.Write(e.data)
	}
	_ = tw.Close()
}
