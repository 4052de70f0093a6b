package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/errclass"
	"github.com/quarryhq/quarry/internal/badinput"
	"github.com/quarryhq/quarry/providers"
	"github.com/quarryhq/quarry/warmpool"
)

// ImageManager is an optional Manager capability: images on demand (an
// image in a create, the images API); *warmpool.Manager implements it.
// Without it an image in a create is 400 and the image routes answer 404.
type ImageManager interface {
	// ImagePool returns the on-demand pool of an image (made when needed);
	// errors as warmpool.Manager.ImagePool's.
	ImagePool(ctx context.Context, req warmpool.ImageRequest) (string, error)
	// Prefetch starts the preparation of images; one result per image.
	Prefetch(ctx context.Context, req warmpool.PrefetchRequest) ([]warmpool.PrefetchResult, error)
	// Images returns a page of the on-demand pools' images; ImagesOf those
	// of the pools named.
	Images(ctx context.Context, cursor string, limit int) (warmpool.ImagePage, error)
	ImagesOf(ctx context.Context, pools, images []string) (warmpool.ImagePage, error)
	// Classes returns the classes with their task counts.
	Classes(ctx context.Context) ([]warmpool.ClassStatus, error)
	// Pool returns a pool's configuration, an on-demand pool's included;
	// warmpool.ErrNotFound for no such pool.
	Pool(ctx context.Context, name string) (warmpool.PoolConfig, error)
	// BuildImage builds an image, streaming its log to log.
	BuildImage(ctx context.Context, req warmpool.BuildRequest, log io.Writer) (providers.ImageInfo, error)
}

// errImagesOff answers the image routes of a gateway whose manager serves
// no image on demand.
var errImagesOff = errclass.New(http.StatusNotFound, "not_found", "this gateway serves no image on demand")

// images returns the manager's image capability, or nil.
func (g *Gateway) images() ImageManager {
	im, _ := g.mgr.(ImageManager)
	return im
}

// imagePool resolves a create's image to its on-demand pool: the pool's
// name, or the error of an image that cannot be served.
func (g *Gateway) imagePool(ctx context.Context, owner string, r *api.CreateSandboxRequest) (string, error) {
	if r.Pool != "" {
		return "", badinput.New("image", "name a pool or an image, not both")
	}
	im := g.images()
	if im == nil {
		return "", badinput.New("image", "this gateway serves no image on demand: name a pool (GET /v1/pools)")
	}
	return im.ImagePool(ctx, warmpool.ImageRequest{
		Image: r.Image, Class: r.Class, CPU: r.CPU, Memory: warmpool.MiB(r.Memory), Disk: warmpool.DiskMiB(r.Disk), Owner: owner,
	})
}

// prefetchFields are the JSON fields of api.PrefetchRequest.
var prefetchFields = []string{"images", "class", "cpu", "memory", "disk", "warm"}

// prefetchImages handles POST /v1/images/prefetch: 202 with each image's
// pool and state; an image refused carries the error an acquire of it
// would get.
func (g *Gateway) prefetchImages(c *fiber.Ctx) error {
	var req api.PrefetchRequest
	if err := g.decodeBody(c, &req, prefetchFields); err != nil {
		return err
	}
	im := g.images()
	if im == nil {
		return errImagesOff
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), g.cfg.CreateTimeout)
	defer cancel()
	res, err := im.Prefetch(ctx, warmpool.PrefetchRequest{
		Images: req.Images, Class: req.Class, CPU: req.CPU, Memory: warmpool.MiB(req.Memory), Disk: warmpool.DiskMiB(req.Disk),
		Warm: req.Warm, Owner: ownerOf(c),
	})
	if err != nil {
		return err
	}
	out := api.PrefetchResponse{Images: make([]api.PrefetchedImage, len(res))}
	for i, r := range res {
		out.Images[i] = api.PrefetchedImage{Image: r.Image, Ref: r.Ref, Pool: r.Pool, State: r.State}
		if r.Err != nil {
			a := errclass.Of(r.Err)
			out.Images[i].Error = &api.ForkError{Status: a.Status, Code: a.Code, Message: a.Message}
		}
	}
	return c.Status(http.StatusAccepted).JSON(out)
}

// listImages handles GET /v1/images?cursor=&limit= (limit 1..1000, 100),
// or ?pool=NAME&image=REF (each repeatable, at most 100): those pools'
// images, and those images while no pool holds them.
func (g *Gateway) listImages(c *fiber.Ctx) error {
	im := g.images()
	if im == nil {
		return errImagesOff
	}
	args := c.Context().QueryArgs()
	limit, err := queryInt(args, "limit", 100, 1, 1000)
	if err != nil {
		return err
	}
	cursor := string(args.Peek("cursor"))
	if len(cursor) > 128 || !badinput.Printable(cursor) {
		return badinput.New("cursor", "must be the next of an earlier answer")
	}
	var pools, refs []string
	for _, p := range args.PeekMulti("pool") {
		if err := checkName(string(p)); err != nil {
			return badinput.New("pool", "%q: %s", p, err.Error())
		}
		pools = append(pools, string(p))
	}
	for _, r := range args.PeekMulti("image") {
		if len(r) > 512 || !badinput.Printable(string(r)) {
			return badinput.New("image", "must be a reference of at most 512 printable characters")
		}
		refs = append(refs, string(r))
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), g.cfg.ManagerTimeout)
	defer cancel()
	var page warmpool.ImagePage
	switch {
	case len(pools)+len(refs) > 0 && cursor != "":
		return badinput.New("pool", "name pools and images, or page with a cursor, not both")
	case len(pools)+len(refs) > 0:
		page, err = im.ImagesOf(ctx, pools, refs)
	default:
		page, err = im.Images(ctx, cursor, int(limit))
	}
	if err != nil {
		return err
	}
	out := api.ImageList{Images: make([]api.Image, 0, len(page.Images)), Next: page.Next}
	for _, s := range page.Images {
		out.Images = append(out.Images, api.Image{
			Image: s.Image, Class: s.Class, Pool: s.Pool, CPU: s.CPU, MemoryMiB: s.MemoryMiB, DiskMiB: s.DiskMiB,
			PoolState: string(s.PoolState), State: string(s.State), Reason: s.Reason, BytesDone: s.BytesDone, BytesTotal: s.BytesTotal,
			SizeBytes: s.SizeBytes, Digest: s.Digest, CreatedAt: s.CreatedAt, LastUsed: s.LastUsed, Acquires: s.Acquires, Warm: s.Warm,
		})
	}
	return c.JSON(out)
}

// classesOf lists the classes for GET /v1/pools (nil without images).
func (g *Gateway) classesOf(ctx context.Context) ([]api.Class, error) {
	im := g.images()
	if im == nil {
		return nil, nil
	}
	cs, err := im.Classes(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.Class, 0, len(cs))
	for _, c := range cs {
		out = append(out, api.Class{
			Name: c.Name, Provider: c.Provider, Images: c.Images, CPU: c.CPU, MemoryMiB: int(c.Memory), DiskMiB: int(c.Disk),
			MaxCPU: c.MaxCPU, MaxMemoryMiB: int(c.MaxMemory), MaxDiskMiB: int(c.MaxDisk), MaxTotal: c.MaxTotal, MaxPerImage: c.MaxPerImage,
			Tasks: c.Tasks,
		})
	}
	return out, nil
}

// whoami handles GET /v1/whoami: the caller's owner id, which
// QUARRY_IMAGE_ALLOW's and QUARRY_IMAGE_BUILD_KEYS's rules name.
func (g *Gateway) whoami(c *fiber.Ctx) error {
	return c.JSON(fiber.Map{"owner": ownerOf(c)})
}

// mayBuild reports whether owner's key may build images
// (QUARRY_IMAGE_BUILD_KEYS: owner ids, or "*" for every key).
func (g *Gateway) mayBuild(owner string) bool {
	for _, k := range g.cfg.ImageBuildKeys {
		if k == "*" || k == owner {
			return true
		}
	}
	return false
}

// buildImage handles POST /v1/images/build?name=NAME[:TAG]&dockerfile=&class=
// with a tar of the build context as its body (at most
// QUARRY_MAX_UPLOAD_BODY). The context is spooled to a temp file first (the
// request's body must be read whole before the answer streams), then the
// build runs within QUARRY_IMAGE_BUILD_TIMEOUT while its log streams to
// the client as application/x-ndjson lines (api.BuildEvent), the last one
// the image built or the build's error. A client that leaves ends the
// build.
func (g *Gateway) buildImage(c *fiber.Ctx) error {
	im := g.images()
	if im == nil {
		return errImagesOff
	}
	owner := ownerOf(c)
	if !g.mayBuild(owner) {
		return errclass.New(http.StatusForbidden, "forbidden",
			"image builds run the Dockerfile's commands on the engine's host: they are off unless the operator names the keys that may build in QUARRY_IMAGE_BUILD_KEYS (this key's owner id: "+owner+")")
	}
	args := c.Context().QueryArgs()
	req := warmpool.BuildRequest{Name: string(args.Peek("name")), Dockerfile: string(args.Peek("dockerfile")), Class: string(args.Peek("class")), Owner: owner}
	if req.Name == "" {
		return badinput.New("name", "is required: the image's NAME[:TAG]")
	}
	if len(req.Dockerfile) > 256 || strings.HasPrefix(req.Dockerfile, "/") || strings.Contains(req.Dockerfile, "..") || !badinput.Printable(req.Dockerfile) {
		return badinput.New("dockerfile", "must be a relative path inside the context, at most 256 characters")
	}
	body, err := openBody(c, g.cfg.MaxUploadBody)
	if err != nil {
		return err
	}
	spool, err := os.CreateTemp("", "quarry-build-*.tar")
	if err != nil {
		return err
	}
	cleanup := func() { spool.Close(); os.Remove(spool.Name()) }
	if _, err := io.Copy(spool, body); err != nil {
		cleanup()
		return err
	}
	if _, err := spool.Seek(0, io.SeekStart); err != nil {
		cleanup()
		return err
	}
	req.Context = spool
	c.Set(fiber.HeaderContentType, "application/x-ndjson")
	c.Response().ImmediateHeaderFlush = true
	c.Context().SetBodyStreamWriter(func(w *bufio.Writer) {
		defer cleanup()
		ctx, cancel := context.WithTimeout(context.Background(), g.cfg.ImageBuildTimeout)
		defer cancel()
		lw := &buildLog{w: w, cancel: cancel}
		stop := lw.keepAlive(buildKeepAlive)
		info, err := im.BuildImage(ctx, req, lw)
		stop()
		ev := api.BuildEvent{Image: info.Image, Digest: info.Digest, SizeBytes: info.SizeBytes}
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				err = errclass.New(http.StatusGatewayTimeout, "timeout", "the build did not end within QUARRY_IMAGE_BUILD_TIMEOUT ("+g.cfg.ImageBuildTimeout.String()+")")
			}
			a := errclass.Of(err)
			if a.Unexpected() {
				g.log.Error("image build failed", "name", req.Name, "err", err)
			}
			ev = api.BuildEvent{Error: &api.ForkError{Status: a.Status, Code: a.Code, Message: a.Message}}
		}
		lw.event(ev)
	})
	return nil
}

// buildKeepAlive is how long a build's answer may be silent before an
// empty event ({}) is sent: a step that prints nothing for minutes must not
// look like a dead connection to the client's read timeout.
const buildKeepAlive = 15 * time.Second

// buildLog writes a build's log to the client, one api.BuildEvent per line
// (a partial line is held until its end), flushing each; a client that
// left cancels the build. mu serializes the build's writes and the
// keep-alives.
type buildLog struct {
	w       *bufio.Writer
	cancel  context.CancelFunc
	mu      sync.Mutex
	partial []byte
	failed  bool
	last    time.Time // the last line written
}

// keepAlive sends an empty event when nothing was written for every, until
// the returned stop is called (which waits for it).
func (b *buildLog) keepAlive(every time.Duration) (stop func()) {
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(every / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				b.mu.Lock()
				if time.Since(b.last) >= every {
					b.line([]byte("{}"))
				}
				b.mu.Unlock()
			}
		}
	}()
	return func() { close(done); <-ended }
}

// maxBuildLine bounds one log line sent; a longer one is cut.
const maxBuildLine = 16 << 10

func (b *buildLog) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := strings.IndexByte(string(p), '\n')
		if i < 0 {
			b.partial = append(b.partial, p[:min(len(p), maxBuildLine-len(b.partial))]...)
			break
		}
		line := append(b.partial, p[:i]...)
		b.partial = nil
		b.write(api.BuildEvent{Log: string(line[:min(len(line), maxBuildLine)])})
		p = p[i+1:]
	}
	if b.failed {
		return n, errors.New("the client left")
	}
	return n, nil
}

// event writes the build's last event (with the rest of a partial line
// before it).
func (b *buildLog) event(ev api.BuildEvent) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.partial) > 0 {
		rest := b.partial
		b.partial = nil
		b.write(api.BuildEvent{Log: string(rest)})
	}
	b.write(ev)
}

// write writes one event line (b.mu held).
func (b *buildLog) write(ev api.BuildEvent) {
	line, _ := json.Marshal(ev)
	b.line(line)
}

// line writes one line and flushes it (b.mu held); a failed write ends the
// build.
func (b *buildLog) line(line []byte) {
	if b.failed {
		return
	}
	b.last = time.Now()
	if _, err := b.w.Write(append(line, '\n')); err == nil {
		if err = b.w.Flush(); err == nil {
			return
		}
	}
	b.failed = true
	b.cancel()
}
