package docker

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/pkg/stdcopy"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/singleflight"

	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/providers"
)

// Copy-on-write work directories (docs/ARCHITECTURE.md, "Copy-on-write
// forks on Docker"). A layer is a checkpoint unpacked once into a volume
// of the engine, owned by the sandbox user; a task started on it gets an
// overlay volume (the layer below, an upper and a work volume of its own)
// mounted at its work directory's parent, so it reads the layer's files and
// writes only its changes. Every directory lives in the engine's volumes:
// the engine mounts the overlay as root, removes what the sandbox wrote,
// and the gateway never touches a file of the host.

// Labels of layer volumes and task volumes.
const (
	// labelLayer is a layer's key: on its volume, on each overlay volume
	// made from it and on the containers that use one.
	labelLayer = "quarry.docker.layer"
	// labelVolume is a volume's role: volumeLayer, volumeOverlay,
	// volumeUpper, volumeWork, or volumeHelper on the container that
	// unpacks a layer (and, for a layer in memory, holds it).
	labelVolume = "quarry.docker.volume"
	// labelLayerVolume, on the unpack's container, names its layer volume.
	labelLayerVolume = "quarry.docker.layer.volume"
)

const (
	volumeLayer   = "layer"
	volumeOverlay = "overlay"
	volumeUpper   = "upper"
	volumeWork    = "work"
	volumeHelper  = "unpack"
)

// OptionCow says when a pool's tasks may start on a layer: "auto" (the
// default: unless the pool bounds its work directory's size, which an
// overlay on the engine's disk cannot keep), "always" (even then: the
// bound no longer holds for such tasks), "never".
const OptionCow = "cow"

const (
	cowAuto   = "auto"
	cowAlways = "always"
	cowNever  = "never"
)

// layerMarker is the file a layer's unpack writes last, at the volume's
// top: a layer volume without it is incomplete (its unpack died).
const layerMarker = ".quarry-layer"

// layerMount is where the unpack's helper container mounts the layer.
const layerMount = "/layer"

// layers is the provider's bookkeeping of the layers this process uses;
// the engine's volumes are the truth, this only keeps a layer from being
// removed while this process prepares it or starts a task on it.
type layers struct {
	flight singleflight.Group
	mu     sync.Mutex
	busy   map[string]int       // by key: prepares and launches under way
	used   map[string]time.Time // by key: last prepared or launched on
	drop   map[string]bool      // by key: DropLayer asked, a task still used it
	// timers, by key: a release due when a kept layer's idle time ends
	// (one per layer at most); wg counts those armed and running; closed:
	// Close stopped them, none is armed again.
	timers map[string]*time.Timer
	wg     sync.WaitGroup
	closed bool
}

func newLayers() *layers {
	return &layers{busy: map[string]int{}, used: map[string]time.Time{}, drop: map[string]bool{}, timers: map[string]*time.Timer{}}
}

// releaseLater arms layer key's release after d, unless one is armed (or
// the provider is closed). The caller holds l.mu.
func (p *Provider) releaseLater(key string, d time.Duration) {
	l := p.layers
	if l.closed || l.timers[key] != nil {
		return
	}
	l.wg.Add(1)
	l.timers[key] = time.AfterFunc(d, func() {
		defer l.wg.Done()
		l.mu.Lock()
		delete(l.timers, key)
		closed := l.closed
		l.mu.Unlock()
		if closed {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		if err := p.releaseLayer(ctx, key); err != nil {
			p.logger.Warn("release an idle layer", "layer", key[:12], "err", err)
		}
	})
}

// closeLayers stops the armed releases and waits for those running: the
// layers they would have removed are found again by the next Provider of
// the gateway (sweepLayers).
func (p *Provider) closeLayers() {
	l := p.layers
	l.mu.Lock()
	l.closed = true
	for key, t := range l.timers {
		if t.Stop() {
			l.wg.Done()
		}
		delete(l.timers, key)
	}
	l.mu.Unlock()
	l.wg.Wait()
}

// sweepLayers arms the release of every layer of this gateway on the
// engine, at once: a layer a process before this one kept idle (or whose
// checkpoint went while none ran) goes when it is idle and unused, one
// still used stays. It costs one engine call and a timer per layer.
func (p *Provider) sweepLayers(ctx context.Context) error {
	vols, err := p.api.VolumeList(ctx, volume.ListOptions{Filters: filters.NewArgs(
		filters.Arg("label", providers.LabelGateway+"="+p.cfg.GatewayID),
		filters.Arg("label", labelVolume+"="+volumeLayer),
	)})
	if err != nil {
		return fmt.Errorf("list the layers: %w", err)
	}
	p.layers.mu.Lock()
	defer p.layers.mu.Unlock()
	for _, v := range vols.Volumes {
		if key := v.Labels[labelLayer]; validKey(key) {
			p.releaseLater(key, 0)
		}
	}
	return nil
}

// hold marks key busy until the returned func is called.
func (l *layers) hold(key string) func() {
	l.mu.Lock()
	l.busy[key]++
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.used[key] = time.Now()
		if l.busy[key]--; l.busy[key] <= 0 {
			delete(l.busy, key)
		}
	}
}

// layerVolumeName is the volume of layer key for tasks of set, of gateway
// gw, on medium (Config.LayerMedium): the unpack gives every entry to the
// sandbox user below the work directory, so pools of another user or work
// directory get a volume of their own from the same archive.
func layerVolumeName(gw, key string, set settings, medium string) string {
	h := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d:%d\x00%s\x00%s", gw, set.uid, set.gid, set.workdir, medium))
	return "quarry-layer-" + key + "-" + hex.EncodeToString(h[:4])
}

// taskVolumeName is the volume of role (overlay, upper, work) of task name.
func taskVolumeName(name, role string) string { return name + "-" + role }

// validKey reports whether key is a layer key: 64 lowercase hex digits.
func validKey(key string) bool {
	if len(key) != 64 {
		return false
	}
	_, err := hex.DecodeString(key)
	return err == nil && strings.ToLower(key) == key
}

// layerParent is the directory an overlay is mounted at for workdir: its
// parent, so that the work directory itself is the layer's (owned by the
// sandbox user) and not the overlay's root (the upper volume's, root's).
func layerParent(workdir string) (string, error) {
	parent := path.Dir(workdir)
	if parent == "/" {
		return "", fmt.Errorf("the work directory %s lies directly below /: a copy-on-write work directory is mounted at its parent", workdir)
	}
	return parent, nil
}

// cowProblem says why tasks of set cannot start on a layer, or "".
func cowProblem(set settings) string {
	switch set.cow {
	case cowNever:
		return fmt.Sprintf("the pool's option %s is %q", OptionCow, cowNever)
	case cowAuto:
		if set.workdirSizeMB > 0 {
			return fmt.Sprintf("the pool bounds its work directory to %d MiB, which an overlay on the engine's disk cannot keep (pool option %s=%s starts forks on a layer anyway)",
				set.workdirSizeMB, OptionCow, cowAlways)
		}
	}
	if _, err := layerParent(set.workdir); err != nil {
		return err.Error()
	}
	return ""
}

// noLayer is the ErrNoLayer of spec, saying why.
func noLayer(reason string) error { return fmt.Errorf("%s: %w", reason, providers.ErrNoLayer) }

// PrepareLayer implements providers.Layers: it unpacks req's archive once
// into a volume of the engine, with the agent's own restore run as the
// sandbox user in a short-lived container of the spec's image (no network,
// no capability), and marks it complete. A layer whose volume is complete
// is used as it is. ErrNoLayer when the pool's options refuse layers
// (OptionCow), its work directory lies directly below /, or the archive
// holds other roots than the work directory (the caller copies instead).
func (p *Provider) PrepareLayer(ctx context.Context, req providers.LayerRequest) error {
	set, err := resolve(p.cfg, req.Spec)
	if err != nil {
		return err
	}
	if !validKey(req.Key) {
		return fmt.Errorf("prepare layer: key %q is not a SHA-256 in hex", req.Key)
	}
	if reason := cowProblem(set); reason != "" {
		return noLayer(reason)
	}
	if !slices.Equal(req.Roots, []string{set.workdir}) {
		return noLayer(fmt.Sprintf("the archive holds %q, not the work directory %s alone", req.Roots, set.workdir))
	}
	done := p.layers.hold(req.Key)
	defer func() {
		done()
		// A layer no task starts on goes when idle, as one whose tasks ended.
		p.layers.mu.Lock()
		p.releaseLater(req.Key, p.cfg.LayerIdle)
		p.layers.mu.Unlock()
	}()
	p.layers.mu.Lock()
	delete(p.layers.drop, req.Key) // wanted again (another checkpoint of the same bytes)
	p.layers.mu.Unlock()
	ch := p.layers.flight.DoChan(req.Key, func() (any, error) {
		// Shared by every caller of the key: it runs to its end (within
		// StartTimeout and the archive's size) whoever gives up waiting.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.StartTimeout+p.cfg.LayerTimeout)
		defer cancel()
		return nil, p.prepareLayer(lctx, req, set)
	})
	select {
	case r := <-ch:
		return r.Err
	case <-ctx.Done():
		return fmt.Errorf("prepare layer: %w", ctx.Err())
	}
}

// prepareLayer is PrepareLayer's shared work. The layer volume holds the
// work directory at its path (home/sandbox for /home/sandbox), the
// sandbox user's; the unpack's container, as that user, runs the agent's
// one-shot restore (execagent -restore) of the archive streamed to its
// stdin into it, which checks the archive's SHA-256 as every restore does;
// the engine writes the marker last.
//
// On LayerMemory the volume is a tmpfs owned by the sandbox user, which
// the engine mounts only while a container that names it runs: the
// unpack's container keeps running after the restore (-hold), holding it
// mounted for the layer's life, and releaseLayer removes it first. On
// LayerDisk the engine first makes the directories down to the work
// directory (the parents root's) and the container exits.
func (p *Provider) prepareLayer(ctx context.Context, req providers.LayerRequest, set settings) (err error) {
	start := time.Now()
	memory := p.cfg.LayerMedium == LayerMemory
	name := layerVolumeName(p.cfg.GatewayID, req.Key, set, p.cfg.LayerMedium)
	create := volume.CreateOptions{Name: name, Driver: "local", Labels: map[string]string{
		providers.LabelGateway: p.cfg.GatewayID, labelVolume: volumeLayer, labelLayer: req.Key,
	}}
	cmd := []string{"-restore", req.Key}
	if memory {
		create.DriverOpts = map[string]string{"type": "tmpfs", "device": "tmpfs", "o": fmt.Sprintf("uid=%d,gid=%d,mode=0755", set.uid, set.gid)}
		cmd = append(cmd, "-hold")
	}
	if _, err := p.api.VolumeCreate(ctx, create); err != nil {
		return fmt.Errorf("prepare layer: create volume: %w", err)
	}
	pids := int64(unpackPids)
	helper, err := p.api.ContainerCreate(ctx, &container.Config{
		Image: req.Spec.Image, User: fmt.Sprintf("%d:%d", set.uid, set.gid),
		Entrypoint: []string{agentPath}, Cmd: cmd,
		Env:        []string{"QUARRY_AGENT_WORKDIR=" + layerMount + set.workdir, "HOME=" + layerMount + set.workdir},
		WorkingDir: "/",
		Labels: map[string]string{providers.LabelGateway: p.cfg.GatewayID, labelVolume: volumeHelper, labelLayer: req.Key,
			labelLayerVolume: name},
		OpenStdin: true, StdinOnce: true, AttachStdin: true,
		NetworkDisabled: true,
	}, &container.HostConfig{
		Mounts: []mount.Mount{
			{Type: mount.TypeBind, Source: p.cfg.AgentBinary, Target: agentPath, ReadOnly: true},
			{Type: mount.TypeVolume, Source: name, Target: layerMount, VolumeOptions: &mount.VolumeOptions{NoCopy: true}},
		},
		NetworkMode: "none",
		LogConfig:   container.LogConfig{Type: "json-file", Config: map[string]string{"max-size": logMaxSize, "max-file": logMaxFiles}},
		CapDrop:     []string{"ALL"},
		SecurityOpt: []string{"no-new-privileges"},
		Resources:   container.Resources{PidsLimit: &pids},
	}, nil, nil, "")
	if err != nil {
		return fmt.Errorf("prepare layer: create the unpack's container: %w", err)
	}
	held := false
	defer func() {
		if held {
			return // it holds the layer in memory
		}
		// The helper first: the engine keeps a volume that a container
		// mounts. An unpack cut short leaves no marker; its volume goes,
		// so that the next attempt starts clean.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if rerr := p.remove(cctx, helper.ID); rerr != nil {
			err = errors.Join(err, fmt.Errorf("remove the unpack's container: %w", rerr))
			return
		}
		if err != nil {
			if rerr := p.removeVolume(cctx, name); rerr != nil {
				p.logger.Warn("remove an incomplete layer", "volume", name, "err", rerr)
			}
		}
	}()
	// Complete: made before, by this process or another. (A layer in
	// memory whose holder is gone is an empty tmpfs here: unpacked again.)
	if _, err := p.api.ContainerStatPath(ctx, helper.ID, layerMount+"/"+layerMarker); err == nil {
		return nil
	} else if !isNotFound(err) {
		return fmt.Errorf("prepare layer: look for its marker: %w", err)
	}
	if memory {
		// An earlier holder whose tmpfs is gone (its container died) goes.
		if err := p.removeHolders(ctx, name, helper.ID); err != nil {
			return fmt.Errorf("prepare layer: %w", err)
		}
	} else {
		var dirs bytes.Buffer
		if err := layerDirs(&dirs, set.workdir, set.uid, set.gid); err != nil {
			return fmt.Errorf("prepare layer: %w", err)
		}
		if err := p.api.CopyToContainer(ctx, helper.ID, layerMount, &dirs, container.CopyToContainerOptions{}); err != nil {
			return fmt.Errorf("prepare layer: make the work directory: %w", err)
		}
	}
	rc, err := req.Open(ctx)
	if err != nil {
		return fmt.Errorf("prepare layer: open the archive: %w", err)
	}
	defer rc.Close()
	src := &readErr{r: rc}
	in := bufio.NewReaderSize(src, layerHeaderPeek)
	if err := checkLayerArchive(in, set.workdir); err != nil {
		return err
	}
	res, err := p.unpack(ctx, helper.ID, in, src)
	if err != nil {
		return fmt.Errorf("prepare layer: %w", err)
	}
	var marker bytes.Buffer
	tw := tar.NewWriter(&marker)
	if err := tw.WriteHeader(&tar.Header{Name: layerMarker, Typeflag: tar.TypeReg, Mode: 0o444, Size: int64(len(req.Key)), ModTime: time.Now()}); err != nil {
		return fmt.Errorf("prepare layer: write its marker: %w", err)
	}
	_, _ = io.WriteString(tw, req.Key)
	if err := tw.Close(); err != nil {
		return fmt.Errorf("prepare layer: write its marker: %w", err)
	}
	if err := p.api.CopyToContainer(ctx, helper.ID, layerMount, &marker, container.CopyToContainerOptions{}); err != nil {
		return fmt.Errorf("prepare layer: write its marker: %w", err)
	}
	held = memory
	p.logger.Info("layer prepared", "layer", req.Key[:12], "pool", req.Spec.Pool, "medium", p.cfg.LayerMedium, "files", res.Files, "bytes", res.Bytes,
		"restore_ms", res.DurationMS, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// removeHolders removes the containers that unpacked (and, in memory,
// hold) layer volume name, but keep (an id, or "").
func (p *Provider) removeHolders(ctx context.Context, name, keep string) error {
	list, err := p.api.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(
		filters.Arg("label", providers.LabelGateway+"="+p.cfg.GatewayID),
		filters.Arg("label", labelLayerVolume+"="+name),
	)})
	if err != nil {
		return fmt.Errorf("list the holders of %s: %w", name, err)
	}
	var errs []error
	for _, c := range list {
		if c.ID == keep {
			continue
		}
		if err := p.remove(ctx, c.ID); err != nil {
			errs = append(errs, fmt.Errorf("remove the holder of %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// unpackPids bounds the processes of a layer's unpack: the agent alone.
const unpackPids = 64

// layerHeaderPeek is how much of an archive checkLayerArchive may read
// ahead for its first entry, the agent's header (its roots: a few paths).
const layerHeaderPeek = 64 << 10

// unpack starts the unpack's container id and streams the archive in to
// its stdin; src is in's source, whose read error (the store's: a blob
// that is not its checkpoint's) wins over what the agent then says. It
// returns the agent's result, the one line it writes to stdout when its
// restore succeeded (after which a held agent goes on running), or its
// exit status and its log's end when it failed.
func (p *Provider) unpack(ctx context.Context, id string, in io.Reader, src *readErr) (agentapi.RestoreResult, error) {
	var res agentapi.RestoreResult
	hj, err := p.api.ContainerAttach(ctx, id, container.AttachOptions{Stream: true, Stdin: true, Stdout: true})
	if err != nil {
		return res, fmt.Errorf("attach to the unpack's stdin: %w", err)
	}
	out := &firstLine{done: make(chan struct{})}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		// Until the line, or the stream's end (hj closed below).
		_, _ = stdcopy.StdCopy(out, io.Discard, hj.Reader)
	}()
	defer func() {
		hj.Close()
		<-copied
	}()
	// Waiting from before the start: a wait begun after the agent exited
	// would find no run to wait for.
	waitCh, waitErr := p.api.ContainerWait(ctx, id, container.WaitConditionNextExit)
	if err := p.api.ContainerStart(ctx, id, container.StartOptions{}); err != nil {
		return res, fmt.Errorf("start the unpack: %w", err)
	}
	if d, ok := ctx.Deadline(); ok {
		_ = hj.Conn.SetWriteDeadline(d)
	}
	_, copyErr := io.Copy(hj.Conn, in)
	if src.err != nil {
		return res, fmt.Errorf("read the archive: %w", src.err)
	}
	if copyErr == nil {
		copyErr = hj.CloseWrite()
	} else {
		hj.Close() // the agent reads a cut archive, fails and exits
	}
	select {
	case <-out.done:
	case r := <-waitCh:
		// Exited: a line it wrote first still counts.
		select {
		case <-out.done:
		case <-copied:
		}
		if !out.complete() {
			return res, fmt.Errorf("the agent's restore exited with %d: %s", r.StatusCode, p.logTail(ctx, id))
		}
	case err := <-waitErr:
		return res, fmt.Errorf("wait for the unpack: %w", err)
	case <-ctx.Done():
		return res, fmt.Errorf("wait for the unpack: %w", ctx.Err())
	}
	if copyErr != nil {
		return res, fmt.Errorf("stream the archive to the unpack: %w", copyErr)
	}
	if err := json.Unmarshal(out.buf.Bytes(), &res); err != nil {
		return res, fmt.Errorf("read the agent's result %q: %w", out.buf.String(), err)
	}
	return res, nil
}

// firstLine keeps what is written to it up to its first newline (at most
// 64 KiB), then closes done and refuses more.
type firstLine struct {
	buf  bytes.Buffer
	done chan struct{}
}

var errLineRead = errors.New("the line was read")

func (w *firstLine) Write(b []byte) (int, error) {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		w.buf.Write(b[:i+1])
		close(w.done)
		return 0, errLineRead
	}
	if w.buf.Len()+len(b) > 64<<10 {
		return 0, errors.New("the agent's result is over 64 KiB")
	}
	return w.buf.Write(b)
}

// complete reports whether the line was read (done closed).
func (w *firstLine) complete() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// readErr remembers its reader's first error other than EOF.
type readErr struct {
	r   io.Reader
	err error
}

func (r *readErr) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	if err != nil && !errors.Is(err, io.EOF) && r.err == nil {
		r.err = err
	}
	return n, err
}

// layerDirs writes the tar that makes a layer's directories down to
// workdir: the parents root's (0755), workdir the sandbox user's (0700;
// the restore gives it the archive's mode).
func layerDirs(w io.Writer, workdir string, uid, gid int) error {
	tw := tar.NewWriter(w)
	parts := strings.Split(strings.Trim(workdir, "/"), "/")
	for i := range parts {
		h := &tar.Header{Name: strings.Join(parts[:i+1], "/") + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Now()}
		if i == len(parts)-1 {
			h.Mode, h.Uid, h.Gid = 0o700, uid, gid
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("make the work directory: %w", err)
		}
	}
	return tw.Close()
}

// checkLayerArchive peeks at the archive in in (tar or tar+gzip), without
// consuming it, for the agent's header: the roots and work directory must
// be workdir, for the restore in the unpack's container to put it in the
// layer (ErrNoLayer otherwise: the caller restores by copy).
func checkLayerArchive(in *bufio.Reader, workdir string) error {
	head, err := in.Peek(layerHeaderPeek)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, bufio.ErrBufferFull) {
		return fmt.Errorf("read the archive: %w", err)
	}
	var r io.Reader = bytes.NewReader(head)
	if agentapi.IsGzip(in) {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return noLayer(fmt.Sprintf("the archive's gzip header: %v", err))
		}
		defer zr.Close()
		r = zr
	}
	hdr, err := tar.NewReader(r).Next()
	if err != nil {
		return noLayer(fmt.Sprintf("the archive's first entry cannot be read from its first %d bytes: %v", len(head), err))
	}
	return checkLayerHeader(hdr, workdir)
}

// checkLayerHeader checks the archive's first entry, the agent's global
// header: its roots must be workdir alone, taken by an agent of the same
// work directory.
func checkLayerHeader(hdr *tar.Header, workdir string) error {
	if hdr.Typeflag != tar.TypeXGlobalHeader {
		return noLayer("the archive does not start with the agent's header")
	}
	var roots []string
	if err := json.Unmarshal([]byte(hdr.PAXRecords[agentapi.PAXRoots]), &roots); err != nil {
		return noLayer(fmt.Sprintf("the archive's roots record: %v", err))
	}
	if !slices.Equal(roots, []string{workdir}) || hdr.PAXRecords[agentapi.PAXWorkdir] != workdir {
		return noLayer(fmt.Sprintf("the archive holds %q of work directory %q, not %s alone", roots, hdr.PAXRecords[agentapi.PAXWorkdir], workdir))
	}
	return nil
}

// DropLayer implements providers.Layers: the layer's volume is removed
// now when no task uses it and this process is not starting one on it,
// else when the last task that uses it stops.
func (p *Provider) DropLayer(ctx context.Context, key string) error {
	if !validKey(key) {
		return nil // no such layer was ever made
	}
	p.layers.mu.Lock()
	p.layers.drop[key] = true
	p.layers.mu.Unlock()
	return p.releaseLayer(ctx, key)
}

// releaseLayer removes layer key's volumes (one per user and work
// directory that used it) when nothing uses it: no overlay volume names
// it, this process holds it for no prepare or launch, and either
// DropLayer asked or it was last used LayerIdle ago. A layer kept only
// because it is not idle long enough is looked at again when it would be
// (releaseLater); one a task uses, when that task stops.
//
// It holds the layers' lock throughout, so that no prepare or launch
// starts on the layer between its look at the volumes and the removal.
func (p *Provider) releaseLayer(ctx context.Context, key string) error {
	p.layers.mu.Lock()
	defer p.layers.mu.Unlock()
	vols, err := p.api.VolumeList(ctx, volume.ListOptions{Filters: filters.NewArgs(
		filters.Arg("label", providers.LabelGateway+"="+p.cfg.GatewayID),
		filters.Arg("label", labelLayer+"="+key),
	)})
	if err != nil {
		return fmt.Errorf("release layer %s: list its volumes: %w", key[:12], err)
	}
	var layers []*volume.Volume
	for _, v := range vols.Volumes {
		switch v.Labels[labelVolume] {
		case volumeLayer:
			layers = append(layers, v)
		case volumeOverlay:
			return nil // a task uses it
		}
	}
	busy, dropped, used := p.layers.busy[key] > 0, p.layers.drop[key], p.layers.used[key]
	if busy {
		return nil
	}
	var errs []error
	for _, v := range layers {
		last := used
		if created, err := time.Parse(time.RFC3339, v.CreatedAt); err == nil && created.After(last) {
			last = created
		}
		if idle := time.Since(last); !dropped && idle < p.cfg.LayerIdle {
			p.releaseLater(key, p.cfg.LayerIdle-idle) // kept for now: looked at again then
			continue
		}
		if err := p.removeHolders(ctx, v.Name, ""); err != nil {
			errs = append(errs, fmt.Errorf("release layer %s: %w", key[:12], err))
			continue
		}
		if err := p.removeVolume(ctx, v.Name); err != nil {
			errs = append(errs, fmt.Errorf("release layer %s: %w", key[:12], err))
			continue
		}
		p.logger.Info("layer removed", "layer", key[:12], "volume", v.Name, "dropped", dropped)
	}
	if len(errs) == 0 && (dropped || len(layers) == 0) {
		delete(p.layers.drop, key) // busy is 0: nothing else remembers it
		delete(p.layers.used, key)
	}
	return errors.Join(errs...)
}

// makeOverlay makes the overlay volume of task name on layer key: an
// upper and a work volume of its own, and the overlay over the layer's
// copy of the work directory's parent. It returns the overlay's name.
func (p *Provider) makeOverlay(ctx context.Context, set settings, name string) (string, error) {
	key := set.layer
	parent, err := layerParent(set.workdir)
	if err != nil {
		return "", err
	}
	labels := func(role string) map[string]string {
		return map[string]string{providers.LabelGateway: p.cfg.GatewayID, providers.LabelTask: name, labelVolume: role, labelLayer: key}
	}
	// The layer's look-up and the two volumes of the task's own at once:
	// each is an engine call that writes its volume store.
	var layer, upper, work volume.Volume
	var g errgroup.Group
	g.Go(func() (err error) {
		layer, err = p.api.VolumeInspect(ctx, layerVolumeName(p.cfg.GatewayID, key, set, p.cfg.LayerMedium))
		switch {
		case isNotFound(err):
			return fmt.Errorf("layer %s is not prepared (or was removed): %w", key[:12], providers.ErrNotFound)
		case err != nil:
			return fmt.Errorf("inspect layer %s: %w", key[:12], err)
		}
		return nil
	})
	for role, v := range map[string]*volume.Volume{volumeUpper: &upper, volumeWork: &work} {
		g.Go(func() (err error) {
			if *v, err = p.api.VolumeCreate(ctx, volume.CreateOptions{Name: taskVolumeName(name, role), Driver: "local", Labels: labels(role)}); err != nil {
				return fmt.Errorf("create the %s volume: %w", role, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return "", err
	}
	ovl := taskVolumeName(name, volumeOverlay)
	_, err = p.api.VolumeCreate(ctx, volume.CreateOptions{Name: ovl, Driver: "local", Labels: labels(volumeOverlay), DriverOpts: map[string]string{
		"type": "overlay", "device": "overlay",
		"o": fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", path.Join(layer.Mountpoint, parent), upper.Mountpoint, work.Mountpoint),
	}})
	if err != nil {
		return "", fmt.Errorf("create the overlay volume: %w", err)
	}
	return ovl, nil
}

// removeTaskVolumes removes the volumes of task name (overlay first, while
// the upper and work volumes it names still exist), then releases its
// layer.
func (p *Provider) removeTaskVolumes(ctx context.Context, name, key string) error {
	var errs []error
	for _, role := range []string{volumeOverlay, volumeUpper, volumeWork} {
		if err := p.removeVolume(ctx, taskVolumeName(name, role)); err != nil {
			errs = append(errs, err)
		}
	}
	if key != "" {
		errs = append(errs, p.releaseLayer(ctx, key))
	}
	return errors.Join(errs...)
}

// cleanTaskVolumes removes the volumes of a launch of task name on layer
// key that failed (nothing when key is ""), logging what it could not.
func (p *Provider) cleanTaskVolumes(ctx context.Context, name, key string) {
	if key == "" {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := p.removeTaskVolumes(cctx, name, key); err != nil {
		p.logger.Warn("remove the volumes of a failed launch", "task", name, "err", err)
	}
}

// removeVolume removes a volume; one already gone counts as removed.
func (p *Provider) removeVolume(ctx context.Context, name string) error {
	if err := p.api.VolumeRemove(ctx, name, false); err != nil && !isNotFound(err) {
		return fmt.Errorf("remove volume %s: %w", name, err)
	}
	return nil
}
