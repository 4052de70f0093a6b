package execagent

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// envd's directory watchers (filesystem.Filesystem/WatchDir, a stream, and
// CreateWatcher, GetWatcherEvents and RemoveWatcher, polled) on inotify:
// one instance per watcher, read through the runtime's poller, one watch
// per directory (every subdirectory when recursive, new ones added as they
// appear). Events are named and typed as envd's fsnotify names them.

// Bounds of watchers.
const (
	// envdMaxWatchers bounds the open watchers of the agent, streams and
	// polled ones together.
	envdMaxWatchers = 64
	// envdMaxWatchDirs bounds the directories one watcher watches.
	envdMaxWatchDirs = 8192
	// envdMaxWatchEvents bounds the events a watcher holds undelivered.
	envdMaxWatchEvents = 4096
	// inotifyBuffer is the size of one read of an inotify instance.
	inotifyBuffer = 64 << 10
	// watcherCloseWait bounds the wait for a closed watcher's reader.
	watcherCloseWait = 5 * time.Second
)

// watchMask is what a watch reports.
const watchMask = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_MOVED_FROM | unix.IN_MODIFY | unix.IN_DELETE |
	unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// watcherTable holds the watchers: it counts them all and names the polled
// ones. Safe for concurrent use.
type watcherTable struct {
	srv    *Server
	mu     sync.Mutex
	open   int                    // watchers open, streams included
	polled map[string]*dirWatcher // CreateWatcher's, by id
}

func newWatcherTable(s *Server) *watcherTable {
	return &watcherTable{srv: s, polled: map[string]*dirWatcher{}}
}

// dirWatcher is one watcher: an inotify instance and the events it has not
// delivered yet.
type dirWatcher struct {
	srv       *Server
	root      string
	recursive bool
	withEntry bool
	f         *os.File // the inotify instance, closed by the closer goroutine
	cancel    context.CancelFunc
	done      chan struct{} // closed when the reader returned
	wake      chan struct{} // 1-buffered: events (or the error) arrived
	budget    int           // directory entries the recursive walks may still read

	dirs  map[int32]string // watch descriptor → directory; the reader's own after start
	names envdNames        // the reader's own

	mu     sync.Mutex
	events []pbFilesystemEvent // bounded: envdMaxWatchEvents
	err    error               // the watcher failed; reported by take
}

// watchRoot resolves and checks the directory of a watch request.
func (s *Server) watchRoot(req *pbWatchRequest) (string, error) {
	p, err := s.envdPath("path", req.Path)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return "", fsError("path", p, err)
	}
	if !fi.IsDir() {
		return "", invalid("path", "%q is not a directory", p)
	}
	if !req.AllowNetworkMounts && onNetworkMount(p) {
		return "", invalid("path", "%q is on a network file system (NFS, SMB, FUSE), whose events may never come; ask with allowNetworkMounts", p)
	}
	return p, nil
}

// onNetworkMount reports whether p is on NFS, SMB/CIFS or FUSE.
func onNetworkMount(p string) bool {
	var st unix.Statfs_t
	if unix.Statfs(p, &st) != nil {
		return false
	}
	switch uint32(st.Type) {
	case unix.NFS_SUPER_MAGIC, unix.CIFS_SUPER_MAGIC, unix.SMB_SUPER_MAGIC, unix.SMB2_SUPER_MAGIC, unix.FUSE_SUPER_MAGIC:
		return true
	}
	return false
}

// start opens a watcher of root (at most envdMaxWatchers open); close it
// with stop.
func (t *watcherTable) start(root string, req *pbWatchRequest) (*dirWatcher, error) {
	t.mu.Lock()
	if t.open >= envdMaxWatchers {
		t.mu.Unlock()
		return nil, t.srv.refused("envdMaxWatchers", withCode(connectResourceExhausted,
			fmt.Errorf("%d directory watchers are open, the most the agent keeps; remove some first", envdMaxWatchers)))
	}
	t.open++
	t.mu.Unlock()
	w, err := t.srv.newDirWatcher(root, req)
	if err != nil {
		t.mu.Lock()
		t.open--
		t.mu.Unlock()
		return nil, err
	}
	return w, nil
}

// stop closes w and waits (bounded) for its reader.
func (t *watcherTable) stop(w *dirWatcher) {
	w.cancel()
	waitDone(w.done, watcherCloseWait)
	t.mu.Lock()
	t.open--
	t.mu.Unlock()
}

// newDirWatcher opens an inotify instance, watches root (and, when
// recursive, its subdirectories) and starts the reader and its closer,
// goroutines of the server that end with cancel or the server's Close.
func (s *Server) newDirWatcher(root string, req *pbWatchRequest) (*dirWatcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, watchLimitError("create an inotify instance", "fs.inotify.max_user_instances", err)
	}
	w := &dirWatcher{
		srv: s, root: root, recursive: req.Recursive, withEntry: req.IncludeEntry,
		f: os.NewFile(uintptr(fd), "inotify"), done: make(chan struct{}), wake: make(chan struct{}, 1),
		dirs: map[int32]string{}, budget: s.cfg.MaxListEntries,
	}
	if err := w.addTree(root); err != nil {
		_ = w.f.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(s.ctx)
	w.cancel = cancel
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		<-ctx.Done()
		_ = w.f.Close() // ends the reader's Read
	}()
	go func() {
		defer s.wg.Done()
		defer close(w.done)
		w.read()
	}()
	return w, nil
}

// watchLimitError explains a failed inotify call: over a kernel limit
// (sysctl names it) is resource_exhausted.
func watchLimitError(action, sysctl string, err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
		return withCode(connectResourceExhausted, fmt.Errorf("%s: the kernel's limit (%s) is reached: %w", action, sysctl, err))
	}
	return fmt.Errorf("%s: %w", action, err)
}

// addDir watches dir.
func (w *dirWatcher) addDir(dir string) error {
	if len(w.dirs) >= envdMaxWatchDirs {
		return w.srv.refused("envdMaxWatchDirs", withCode(connectResourceExhausted,
			fmt.Errorf("watching %q: more than %d directories to watch, the most one watcher watches", w.root, envdMaxWatchDirs)))
	}
	raw, err := w.f.SyscallConn()
	if err != nil {
		return fmt.Errorf("watch %q: %w", dir, err)
	}
	var wd int
	cerr := raw.Control(func(fd uintptr) { wd, err = unix.InotifyAddWatch(int(fd), dir, watchMask) })
	if cerr != nil {
		return fmt.Errorf("watch %q: %w", dir, cerr)
	}
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			return nil // gone (or replaced) before it was watched
		}
		return watchLimitError(fmt.Sprintf("watch %q", dir), "fs.inotify.max_user_watches", err)
	}
	w.dirs[int32(wd)] = dir
	return nil
}

// addTree watches dir and, when recursive, every directory below it
// (symlinks not followed), reading at most the watcher's entry budget.
func (w *dirWatcher) addTree(dir string) error {
	if err := w.addDir(dir); err != nil || !w.recursive {
		return err
	}
	f, err := os.Open(dir)
	if err != nil {
		return nil // gone or unreadable: its own events still come
	}
	defer f.Close()
	for {
		ents, err := f.ReadDir(256)
		w.budget -= len(ents)
		if w.budget < 0 {
			return w.srv.refused("QUARRY_AGENT_MAX_LIST_ENTRIES", withCode(connectResourceExhausted,
				fmt.Errorf("watching %q recursively: more entries below it than the agent reads (QUARRY_AGENT_MAX_LIST_ENTRIES)", w.root)))
		}
		for _, e := range ents {
			if e.IsDir() {
				if err := w.addTree(filepath.Join(dir, e.Name())); err != nil {
					return err
				}
			}
		}
		if err != nil || len(ents) == 0 {
			return nil // io.EOF, or unreadable from here
		}
	}
}

// read reads events until the instance is closed.
func (w *dirWatcher) read() {
	buf := make([]byte, inotifyBuffer)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) && !errors.Is(err, io.EOF) {
				w.fail(fmt.Errorf("read inotify events: %w", err))
			}
			return
		}
		w.parse(buf[:n])
	}
}

// parse handles the events of one read (struct inotify_event: wd, mask,
// cookie, len, then len bytes of NUL-padded name).
func (w *dirWatcher) parse(b []byte) {
	for len(b) >= unix.SizeofInotifyEvent {
		wd := int32(binary.NativeEndian.Uint32(b[0:4]))
		mask := binary.NativeEndian.Uint32(b[4:8])
		n := int(binary.NativeEndian.Uint32(b[12:16]))
		b = b[unix.SizeofInotifyEvent:]
		if n > len(b) {
			return
		}
		name := string(b[:n])
		for len(name) > 0 && name[len(name)-1] == 0 {
			name = name[:len(name)-1]
		}
		b = b[n:]
		w.handle(wd, mask, name)
	}
}

// handle turns one inotify event into envd's events.
func (w *dirWatcher) handle(wd int32, mask uint32, name string) {
	if mask&unix.IN_Q_OVERFLOW != 0 {
		w.fail(w.srv.refused("fs.inotify.max_queued_events",
			withCode(connectResourceExhausted, errors.New("the kernel's inotify queue overflowed: events were lost"))))
		return
	}
	dir, ok := w.dirs[wd]
	if !ok {
		return
	}
	if mask&unix.IN_IGNORED != 0 {
		delete(w.dirs, wd)
		return
	}
	if strings.HasPrefix(name, uploadTempPrefix) {
		return // a write's staged file: the rename into place is the event
	}
	p := dir
	if name != "" {
		p = filepath.Join(dir, name)
	} else if dir != w.root {
		return // a subdirectory's own removal or move: its parent reports it
	}
	if w.recursive && name != "" && mask&unix.IN_ISDIR != 0 && mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
		if err := w.addTree(p); err != nil {
			w.fail(err)
			return
		}
	}
	rel, err := filepath.Rel(w.root, p)
	if err != nil {
		rel = p
	}
	for _, typ := range eventTypes(mask) {
		ev := pbFilesystemEvent{Name: rel, Type: typ}
		if w.withEntry && (typ == eventCreate || typ == eventWrite || typ == eventChmod) {
			if fi, err := os.Lstat(p); err == nil { // gone meanwhile: no entry
				ev.Entry = envdEntry(p, p, fi, &w.names)
			}
		}
		w.push(ev)
	}
}

// eventTypes maps an inotify mask to envd's event types, in fsnotify's
// order.
func eventTypes(mask uint32) []string {
	var out []string
	if mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
		out = append(out, eventCreate)
	}
	if mask&(unix.IN_MOVED_FROM|unix.IN_MOVE_SELF) != 0 {
		out = append(out, eventRename)
	}
	if mask&unix.IN_ATTRIB != 0 {
		out = append(out, eventChmod)
	}
	if mask&unix.IN_MODIFY != 0 {
		out = append(out, eventWrite)
	}
	if mask&(unix.IN_DELETE|unix.IN_DELETE_SELF) != 0 {
		out = append(out, eventRemove)
	}
	return out
}

// push queues an event; a full queue fails the watcher.
func (w *dirWatcher) push(ev pbFilesystemEvent) {
	w.mu.Lock()
	switch {
	case w.err != nil:
	case len(w.events) >= envdMaxWatchEvents:
		w.err = w.srv.refused("envdMaxWatchEvents", withCode(connectResourceExhausted,
			fmt.Errorf("more than %d events of %q were not read: the watcher stopped; create a new one and read more often", envdMaxWatchEvents, w.root)))
	default:
		w.events = append(w.events, ev)
	}
	w.mu.Unlock()
	w.signal()
}

// fail records the watcher's first error.
func (w *dirWatcher) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
	w.signal()
}

func (w *dirWatcher) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// take returns the events not delivered yet, or the watcher's error.
func (w *dirWatcher) take() ([]pbFilesystemEvent, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return nil, w.err
	}
	evs := w.events
	w.events = nil
	return evs, nil
}

// envdWatchDir answers filesystem.Filesystem/WatchDir: start{}, then the
// events and keepalives until the client leaves, the watcher fails,
// Connect-Timeout-Ms passes or the agent closes.
func (s *Server) envdWatchDir(r *http.Request, req *pbWatchRequest, st *connectStream) error {
	limit, err := requestTimeout(r)
	if err != nil {
		return err
	}
	root, err := s.watchRoot(req)
	if err != nil {
		return err
	}
	w, err := s.watchers.start(root, req)
	if err != nil {
		return err
	}
	defer s.watchers.stop(w)
	if st.send(pbWatchDirResponse{Start: &struct{}{}}) != nil {
		return nil
	}
	clock := newStreamClock(r, limit)
	defer clock.Stop()
	for {
		select {
		case <-w.wake:
			evs, err := w.take()
			if err != nil {
				return err
			}
			for i := range evs {
				if st.send(pbWatchDirResponse{Filesystem: &evs[i]}) != nil {
					return nil
				}
			}
			clock.sent()
		case <-clock.keep.C:
			if st.send(pbWatchDirResponse{Keepalive: &struct{}{}}) != nil {
				return nil
			}
		case <-r.Context().Done():
			return nil
		case <-s.ctx.Done():
			return fmt.Errorf("watch of %q: %w", root, errClosed)
		case <-clock.expired:
			return withCode(connectDeadlineExceeded, fmt.Errorf("the watch of %q reached its deadline (Connect-Timeout-Ms)", root))
		}
	}
}

// envdCreateWatcher answers filesystem.Filesystem/CreateWatcher.
func (s *Server) envdCreateWatcher(_ *http.Request, req *pbWatchRequest) (*pbCreateWatcherResponse, error) {
	root, err := s.watchRoot(req)
	if err != nil {
		return nil, err
	}
	w, err := s.watchers.start(root, req)
	if err != nil {
		return nil, err
	}
	id := newID("w")
	s.watchers.mu.Lock()
	s.watchers.polled[id] = w
	s.watchers.mu.Unlock()
	return &pbCreateWatcherResponse{WatcherID: id}, nil
}

// polledWatcher returns the polled watcher id (removing it with remove).
func (t *watcherTable) polledWatcher(id string, remove bool) (*dirWatcher, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	w, ok := t.polled[id]
	if !ok {
		return nil, fmt.Errorf("watcher %q: %w", id, errNotFound)
	}
	if remove {
		delete(t.polled, id)
	}
	return w, nil
}

// envdGetWatcherEvents answers filesystem.Filesystem/GetWatcherEvents: the
// events since the last call, or the watcher's error.
func (s *Server) envdGetWatcherEvents(_ *http.Request, req *pbWatcherRequest) (*pbGetWatcherEventsResponse, error) {
	w, err := s.watchers.polledWatcher(req.WatcherID, false)
	if err != nil {
		return nil, err
	}
	evs, err := w.take()
	if err != nil {
		return nil, err
	}
	return &pbGetWatcherEventsResponse{Events: evs}, nil
}

// envdRemoveWatcher answers filesystem.Filesystem/RemoveWatcher.
func (s *Server) envdRemoveWatcher(_ *http.Request, req *pbWatcherRequest) (*pbEmpty, error) {
	w, err := s.watchers.polledWatcher(req.WatcherID, true)
	if err != nil {
		return nil, err
	}
	s.watchers.stop(w)
	return &pbEmpty{}, nil
}
