package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/pkg/jsonmessage"

	"github.com/quarryhq/quarry/providers"
)

// errClosed ends the pulls of a provider that closed.
var errClosed = errors.New("the Docker provider closed")

// flight is one pull of an image, which every PrepareImage of that image
// waits for while it runs. The provider keeps it in imageCache.flights from
// its start until it failed or, after a success, until the budget's pass
// after it ran (so that pass never removes the image just pulled; callers
// meanwhile get its answer at once).
type flight struct {
	image string // as the first caller asked for it
	ref   imageRef
	// onDemand: a caller was an on-demand pool's (Spec.Class set), so a
	// pull is recorded in the ledger. Guarded by imageCache.mu.
	onDemand bool
	started  time.Time
	// bytesDone and bytesTotal are the pull's progress, from its stream:
	// the compressed bytes of the layers it downloads.
	bytesDone, bytesTotal atomic.Int64

	done chan struct{} // closed when info and err are set
	info providers.ImageInfo
	err  error
}

// layerProgress is one layer's download as the pull's stream reports it.
type layerProgress struct{ done, total int64 }

// run makes f's image ready: it waits for a pull slot (Config.PullConcurrency),
// looks again (a pull that just ended may have brought the image), pulls
// it within Config.PullTimeout, records it in the ledger when an on-demand
// pool asked, answers the waiting callers, then enforces the budget. It
// runs in a goroutine of its own, owned by c (c.wg).
func (c *imageCache) run(f *flight) {
	defer c.wg.Done()
	img, pulled, err := c.fetch(f)
	c.mu.Lock()
	onDemand := f.onDemand
	c.mu.Unlock()
	if err == nil && pulled && onDemand {
		err = c.record(f, img)
	}
	c.finish(f, c.infoOf(f.image, f.ref, img), err)
	if err == nil && pulled && onDemand {
		c.enforceBudget(c.ctx)
	}
	c.mu.Lock()
	c.forget(f)
	c.mu.Unlock()
}

// forget removes f from the flights (unless a later flight of its image
// took its place). Call with mu held.
func (c *imageCache) forget(f *flight) {
	if c.flights[f.ref.name] == f {
		delete(c.flights, f.ref.name)
	}
}

// fetch waits for a slot and pulls unless the engine has the image now.
func (c *imageCache) fetch(f *flight) (img engineImage, pulled bool, err error) {
	select {
	case c.slots <- struct{}{}:
	case <-c.ctx.Done():
		return engineImage{}, false, errClosed
	}
	defer func() { <-c.slots }()
	ctx, cancel := context.WithTimeout(c.ctx, c.pullTimeout)
	defer cancel()
	if img, found, err := c.inspect(ctx, f.ref); err != nil || found {
		return img, false, err
	}
	if err := c.pull(ctx, f); err != nil {
		return engineImage{}, false, err
	}
	img, found, err := c.inspect(ctx, f.ref)
	if err == nil && !found {
		err = fmt.Errorf("pull image %s: the engine does not have it after the pull", f.ref.name)
	}
	return img, true, err
}

// pull pulls f's image through the engine with the registry's credentials
// and follows its stream until it ends, keeping the progress in f.
func (c *imageCache) pull(ctx context.Context, f *flight) error {
	auth, err := registryAuth(c.dockerConfig, f.ref.registry)
	if err != nil {
		return fmt.Errorf("pull image %s: %w", f.ref.name, err)
	}
	c.metrics.pullsStarted.Inc()
	rc, err := c.api.ImagePull(ctx, f.ref.name, image.PullOptions{RegistryAuth: auth})
	if err != nil {
		return c.pullFailed(ctx, f, err)
	}
	defer rc.Close()
	layers := map[string]layerProgress{}
	dec := json.NewDecoder(rc)
	for {
		var m jsonmessage.JSONMessage
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return c.pullFailed(ctx, f, err)
		}
		if m.Error != nil {
			return c.pullFailed(ctx, f, errors.New(m.Error.Message))
		}
		if m.ID == "" {
			continue
		}
		if progressOf(layers, m) {
			done, total := sumProgress(layers)
			f.bytesDone.Store(done)
			f.bytesTotal.Store(total)
		}
	}
}

// pullFailed translates a pull's failure (pullError): ctx's own end
// first, as the stream reports it in words of its own.
func (c *imageCache) pullFailed(ctx context.Context, f *flight, err error) error {
	if ctx.Err() != nil {
		err = ctx.Err()
	}
	if c.ctx.Err() != nil {
		err = errClosed
	}
	return pullError(f.image, f.ref, err)
}

// progressOf updates layers with one message of a pull's stream and
// reports whether it changed them: "Downloading" carries a layer's bytes,
// "Download complete", "Extracting" and "Pull complete" mean all of them.
// A layer the engine has already ("Already exists") is no part of it.
func progressOf(layers map[string]layerProgress, m jsonmessage.JSONMessage) bool {
	l, known := layers[m.ID]
	switch m.Status {
	case "Pulling fs layer", "Waiting":
		if known {
			return false
		}
	case "Downloading":
		if m.Progress != nil {
			l.done, l.total = m.Progress.Current, max(m.Progress.Total, l.total)
		}
	case "Verifying Checksum", "Download complete", "Extracting", "Pull complete":
		l.done = l.total
	default:
		return false
	}
	layers[m.ID] = l
	return true
}

// sumProgress adds up the layers' progress.
func sumProgress(layers map[string]layerProgress) (done, total int64) {
	for _, l := range layers {
		done += l.done
		total += l.total
	}
	return done, total
}

// record adds the image f pulled to the ledger, used now.
func (c *imageCache) record(f *flight, img engineImage) error {
	now := time.Now()
	return c.ledger.add(ledgerEntry{
		Ref: f.ref.name, Image: f.image, ID: img.id, Digest: img.digest, Size: img.size,
		Pulled: now, LastUsed: now,
	})
}

// finish answers f's callers, counts the pull's outcome, and keeps a
// failure for Images (or forgets an earlier one).
func (c *imageCache) finish(f *flight, info providers.ImageInfo, err error) {
	outcome := "ready"
	var ie *providers.ImageError
	switch {
	case errors.As(err, &ie):
		outcome = string(ie.Kind)
	case err != nil:
		outcome = "error"
	}
	c.metrics.pulls.WithLabelValues(outcome).Inc()
	took := time.Since(f.started).Round(time.Millisecond)
	if err != nil {
		c.logger.Warn("image not prepared", "image", f.image, "ref", f.ref.name, "took", took, "err", err)
		info = providers.ImageInfo{Image: f.image, State: providers.ImageFailed, Reason: err.Error()}
	} else {
		c.logger.Info("image ready", "image", f.image, "ref", f.ref.name, "digest", info.Digest, "size", info.SizeBytes, "took", took)
	}
	c.mu.Lock()
	f.info, f.err = info, err
	if err != nil {
		c.addFailure(f.ref.name, info)
		c.forget(f) // the next caller tries again
	} else {
		delete(c.failures, f.ref.name)
	}
	c.mu.Unlock()
	close(f.done)
}
