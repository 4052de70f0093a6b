package ecs

import "sync"

// nameCacheSize bounds the names the provider remembers (about 250 bytes
// each): the live tasks of a 10k-sandbox fleet and their churn.
const nameCacheSize = 1 << 15

// taskName is what a task's tags say of it and ECS's events do not.
type taskName struct{ name, pool string }

// nameCache maps task ARNs to the names and pools the provider saw for
// them (launches, describes, lists), so that events (which carry no tags)
// can name their tasks. Bounded: past max entries the oldest goes. Only a
// cache: a miss costs a DescribeTasks, never a wrong answer. Safe for
// concurrent use.
type nameCache struct {
	mu    sync.Mutex
	m     map[string]taskName
	order []string // insertion order, a ring once full
	head  int      // oldest entry of order once full
	max   int
}

func newNameCache(max int) *nameCache {
	return &nameCache{m: map[string]taskName{}, max: max}
}

// put remembers arn's name and pool (an unnamed task is not remembered).
func (c *nameCache) put(arn, name, pool string) {
	if name == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[arn]; ok {
		c.m[arn] = taskName{name, pool}
		return
	}
	if len(c.order) < c.max {
		c.order = append(c.order, arn)
	} else {
		delete(c.m, c.order[c.head])
		c.order[c.head] = arn
		c.head = (c.head + 1) % c.max
	}
	c.m[arn] = taskName{name, pool}
}

// get returns arn's name and pool, if remembered.
func (c *nameCache) get(arn string) (taskName, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.m[arn]
	return n, ok
}
