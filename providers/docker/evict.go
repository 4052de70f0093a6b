package docker

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
)

// evictTimeout bounds one pass of the budget's enforcement.
const evictTimeout = 2 * time.Minute

// keeper says why an image may not be removed now ("" when it may).
type keeper func(e ledgerEntry) (why string, err error)

// chooseEvictions returns, least recently used first, the entries to
// remove so that the entries' sizes add up to budget or less, skipping
// those keep names a reason for (in use, needed by a pull or launch in
// flight, pinned); over is how far above budget the entries stay after
// those removals (0: the budget is met). keep is asked only about the
// entries that a removal could help with, in that order, and not at all
// when the ledger is within budget. An error of keep ends the choice.
func chooseEvictions(entries []ledgerEntry, budget int64, keep keeper) (victims []ledgerEntry, over int64, err error) {
	total := sumSizes(entries)
	if budget <= 0 || total <= budget {
		return nil, 0, nil
	}
	lru := slices.Clone(entries)
	slices.SortStableFunc(lru, func(a, b ledgerEntry) int {
		return cmp.Or(a.LastUsed.Compare(b.LastUsed), cmp.Compare(a.Ref, b.Ref))
	})
	for _, e := range lru {
		if total <= budget {
			break
		}
		why, err := keep(e)
		if err != nil {
			return victims, total - budget, err
		}
		if why != "" {
			continue
		}
		victims = append(victims, e)
		total -= e.Size
	}
	return victims, max(0, total-budget), nil
}

// enforceBudget removes ledger images past Config.ImageBudget (after a
// pull), least recently used first, never one that a container (running
// or not, of any gateway) uses, that a pull or launch in flight needs, or
// that a configured pool uses. Each removal, and a budget it cannot meet,
// is logged and counted. One pass runs at a time; each removal checks its
// image again under evictMu, which a launch takes to mark its image
// needed, so a launch never finds its image removed under it.
func (c *imageCache) enforceBudget(ctx context.Context) {
	if c.budget <= 0 {
		return
	}
	c.evictPass.Lock()
	defer c.evictPass.Unlock()
	ctx, cancel := context.WithTimeout(ctx, evictTimeout)
	defer cancel()
	entries, _ := c.ledger.snapshot()
	victims, over, err := chooseEvictions(entries, int64(c.budget), func(e ledgerEntry) (string, error) {
		return c.keepReason(ctx, e)
	})
	if err != nil {
		c.logger.Warn("image budget: cannot tell which images are in use; nothing more removed", "err", err)
	}
	for _, v := range victims {
		kept, err := c.evict(ctx, v)
		if err != nil || kept != "" {
			c.logger.Warn("image budget: image not removed", "image", v.Image, "ref", v.Ref, "kept", kept, "err", err)
			over += v.Size
			continue
		}
		c.metrics.evictions.Inc()
		c.logger.Info("image removed to keep the image cache within its budget", "image", v.Image, "ref", v.Ref,
			"size", v.Size, "last_used", v.LastUsed, "budget", int64(c.budget))
	}
	if over > 0 {
		c.metrics.budgetUnmet.Inc()
		c.logger.Warn("image budget cannot be met: the images left are in use, pinned by configured pools or needed by pulls and launches in flight",
			"budget", int64(c.budget), "over_by", over, "limit", "QUARRY_DOCKER_IMAGE_BUDGET")
	}
}

// evict removes e unless, checked again under evictMu, something keeps it:
// kept then says what.
func (c *imageCache) evict(ctx context.Context, e ledgerEntry) (kept string, err error) {
	c.evictMu.Lock()
	defer c.evictMu.Unlock()
	if kept, err = c.keepReason(ctx, e); err != nil || kept != "" {
		return kept, err
	}
	return "", c.removeImage(ctx, e)
}

// keepReason says why e may not be removed now, "" when it may.
func (c *imageCache) keepReason(ctx context.Context, e ledgerEntry) (string, error) {
	if c.ledger.isPinned(e.Ref) {
		return "pinned by a configured pool", nil
	}
	if c.busy(e.Ref) {
		return "a pull or launch in flight needs it", nil
	}
	used, err := c.inUse(ctx, e.ID, e.Ref)
	if err != nil {
		return "", err
	}
	if used {
		return "a container uses it", nil
	}
	return "", nil
}

// inUse reports whether a container of the engine (running or not, of any
// gateway) was made from the image (by id, else ref) or an image built on
// it: one list filtered by the engine, at most one container long.
func (c *imageCache) inUse(ctx context.Context, id, ref string) (bool, error) {
	ancestor := cmp.Or(id, ref)
	list, err := c.api.ContainerList(ctx, container.ListOptions{All: true, Limit: 1, Filters: filters.NewArgs(filters.Arg("ancestor", ancestor))})
	if isNotFound(err) {
		return false, nil // the image is gone already
	}
	if err != nil {
		return false, fmt.Errorf("list the containers of image %s: %w", ref, err)
	}
	return len(list) > 0, nil
}

// removeImage removes e's reference from the engine (never forced: the
// engine refuses while a container uses it) and from the ledger. An image
// already gone counts as removed.
func (c *imageCache) removeImage(ctx context.Context, e ledgerEntry) error {
	_, err := c.api.ImageRemove(ctx, e.Ref, image.RemoveOptions{PruneChildren: true})
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("remove image %s: %w", e.Ref, err)
	}
	return c.ledger.remove(e.Ref)
}

// sumSizes adds up the entries' sizes.
func sumSizes(entries []ledgerEntry) int64 {
	var n int64
	for _, e := range entries {
		n += e.Size
	}
	return n
}
