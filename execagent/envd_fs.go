package execagent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// envd's filesystem service (filesystem.Filesystem): Stat, ListDir,
// MakeDir, Move and Remove here, the watchers in envd_watch.go. Paths
// resolve as envdPath (envd.go) says; errors are fsError's.

// filesystemMethods are the RPCs of filesystem.Filesystem.
func (s *Server) filesystemMethods() map[string]envdMethod {
	return map[string]envdMethod{
		"Stat":             unary(s, s.envdStat),
		"ListDir":          unary(s, s.envdListDir),
		"MakeDir":          unary(s, s.envdMakeDir),
		"Move":             unary(s, s.envdMove),
		"Remove":           unary(s, s.envdRemove),
		"WatchDir":         serverStream(s, s.envdWatchDir),
		"CreateWatcher":    unary(s, s.envdCreateWatcher),
		"GetWatcherEvents": unary(s, s.envdGetWatcherEvents),
		"RemoveWatcher":    unary(s, s.envdRemoveWatcher),
	}
}

// envdNames caches the names of user and group ids for one answer: owner
// and group are names when /etc/passwd and /etc/group know them, else the
// numbers, as envd reports them.
type envdNames struct {
	users, groups map[uint32]string
}

func (n *envdNames) name(ids *map[uint32]string, id uint32, lookup func(string) (string, error)) string {
	if v, ok := (*ids)[id]; ok {
		return v
	}
	if *ids == nil {
		*ids = map[uint32]string{}
	}
	name := strconv.FormatUint(uint64(id), 10)
	if v, err := lookup(name); err == nil {
		name = v
	}
	(*ids)[id] = name
	return name
}

func (n *envdNames) user(uid uint32) string {
	return n.name(&n.users, uid, func(id string) (string, error) {
		u, err := user.LookupId(id)
		if err != nil {
			return "", err
		}
		return u.Username, nil
	})
}

func (n *envdNames) group(gid uint32) string {
	return n.name(&n.groups, gid, func(id string) (string, error) {
		g, err := user.LookupGroupId(id)
		if err != nil {
			return "", err
		}
		return g.Name, nil
	})
}

// envdEntry is envd's EntryInfo of the entry at p, fi its Lstat, reported
// at path shown. As envd does, a symlink reports its target's type and
// permission bits with the resolved target in symlinkTarget (a dangling one
// is FILE_TYPE_SYMLINK with its link text), and permissions is the mode
// string of the entry itself; other kinds (devices, FIFOs, sockets) have no
// type. metadata is the file's (envd_meta.go).
func envdEntry(p, shown string, fi fs.FileInfo, names *envdNames) *pbEntryInfo {
	mode := fi.Mode()
	e := &pbEntryInfo{Name: fi.Name(), Path: shown, Size: fi.Size(), Permissions: mode.String()}
	kind := mode
	if mode&fs.ModeSymlink != 0 {
		target, err := filepath.EvalSymlinks(p)
		if err != nil {
			target, _ = os.Readlink(p)
		}
		e.SymlinkTarget = &target
		if ti, err := os.Stat(p); err == nil {
			kind = ti.Mode()
		}
	}
	switch {
	case kind.IsRegular():
		e.Type = fileTypeFile
	case kind.IsDir():
		e.Type = fileTypeDirectory
	case kind&fs.ModeSymlink != 0:
		e.Type = fileTypeSymlink
	}
	e.Mode = uint32(kind.Perm())
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner, e.Group = names.user(st.Uid), names.group(st.Gid)
	}
	if mt := fi.ModTime(); !mt.IsZero() {
		ts := pbTimestamp(mt)
		e.ModifiedTime = &ts
	}
	e.Metadata = readMetadata(p)
	return e
}

// envdStat answers filesystem.Filesystem/Stat (a final symlink is not
// followed).
func (s *Server) envdStat(_ *http.Request, req *pbPathRequest) (*pbEntryResponse, error) {
	p, err := s.envdPath("path", req.Path)
	if err != nil {
		return nil, err
	}
	return lstatEntry("path", p)
}

// lstatEntry answers the EntryInfo of p.
func lstatEntry(field, p string) (*pbEntryResponse, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, fsError(field, p, err)
	}
	return &pbEntryResponse{Entry: envdEntry(p, p, fi, &envdNames{})}, nil
}

// envdListDir answers filesystem.Filesystem/ListDir: the entries under the
// directory (a symlink to one is followed) down to depth levels (0 is 1),
// each directory's in name order before its subdirectories' (symlinks are
// not followed below), reported under the path asked for. More than
// MaxListEntries in all is refused; an unreadable subdirectory is listed
// but not entered.
func (s *Server) envdListDir(_ *http.Request, req *pbListDirRequest) (*pbListDirResponse, error) {
	p, err := s.envdPath("path", req.Path)
	if err != nil {
		return nil, err
	}
	dir, err := filepath.EvalSymlinks(p)
	if err != nil {
		return nil, fsError("path", p, err)
	}
	if fi, err := os.Stat(dir); err != nil {
		return nil, fsError("path", p, err)
	} else if !fi.IsDir() {
		return nil, invalid("path", "%q is not a directory", p)
	}
	l := &dirLister{depth: max(int(req.Depth), 1), left: s.cfg.MaxListEntries}
	if err := l.walk(dir, p, 1); err != nil {
		if errors.Is(err, errTooLarge) {
			return nil, s.refused("QUARRY_AGENT_MAX_LIST_ENTRIES", fmt.Errorf("%q has more than %d entries within depth %d (QUARRY_AGENT_MAX_LIST_ENTRIES): %w",
				p, s.cfg.MaxListEntries, l.depth, errTooLarge))
		}
		return nil, fsError("path", p, err)
	}
	return &pbListDirResponse{Entries: l.out}, nil
}

// dirLister walks a directory for ListDir, within a budget of entries.
type dirLister struct {
	depth int
	left  int // entries the answer may still hold
	names envdNames
	out   []*pbEntryInfo
}

// walk lists dir (shown as shown) at level, and its subdirectories below
// the depth; errTooLarge when the budget runs out. It reads at most the
// budget's worth of each directory.
func (l *dirLister) walk(dir, shown string, level int) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	ents, err := f.ReadDir(l.left + 1)
	_ = f.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if len(ents) > l.left {
		return errTooLarge
	}
	slices.SortFunc(ents, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		if l.left == 0 { // a subdirectory listed before took the rest
			return errTooLarge
		}
		p, sp := filepath.Join(dir, e.Name()), filepath.Join(shown, e.Name())
		l.out = append(l.out, envdEntry(p, sp, fi, &l.names))
		l.left--
		if !e.IsDir() || level >= l.depth {
			continue
		}
		if err := l.walk(p, sp, level+1); errors.Is(err, errTooLarge) {
			return err
		}
	}
	return nil
}

// envdMakeDir answers filesystem.Filesystem/MakeDir: the directory and its
// parents; already_exists when it is there.
func (s *Server) envdMakeDir(_ *http.Request, req *pbPathRequest) (*pbEntryResponse, error) {
	p, err := s.envdPath("path", req.Path)
	if err != nil {
		return nil, err
	}
	switch fi, err := os.Stat(p); {
	case err == nil && fi.IsDir():
		return nil, withCode(connectAlreadyExists, fmt.Errorf("directory %q already exists", p))
	case err == nil:
		return nil, invalid("path", "%q exists and is not a directory", p)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fsError("path", p, err)
	}
	if err := os.MkdirAll(p, 0o755); err != nil {
		return nil, fsError("path", p, err)
	}
	return lstatEntry("path", p)
}

// envdMove answers filesystem.Filesystem/Move: a rename, the destination's
// parents created.
func (s *Server) envdMove(_ *http.Request, req *pbMoveRequest) (*pbEntryResponse, error) {
	if req.Source == "" || req.Destination == "" {
		return nil, invalid("source", "source and destination are required")
	}
	src, err := s.envdPath("source", req.Source)
	if err != nil {
		return nil, err
	}
	dst, err := s.envdPath("destination", req.Destination)
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(src); err != nil {
		return nil, fsError("source", src, err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return nil, fsError("destination", dst, err)
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, fsError("destination", dst, err)
	}
	return lstatEntry("destination", dst)
}

// envdRemove answers filesystem.Filesystem/Remove: the entry and all it
// holds; nothing there is no error, as envd's RemoveAll.
func (s *Server) envdRemove(_ *http.Request, req *pbPathRequest) (*pbEmpty, error) {
	if req.Path == "" {
		return nil, invalid("path", "required")
	}
	p, err := s.envdPath("path", req.Path)
	if err != nil {
		return nil, err
	}
	if err := os.RemoveAll(p); err != nil {
		return nil, fsError("path", p, err)
	}
	return &pbEmpty{}, nil
}
