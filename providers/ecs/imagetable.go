package ecs

import (
	"container/list"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/quarryhq/quarry/providers"
)

// imageCacheSize bounds the task definitions of on-demand pools the
// provider remembers (a few hundred bytes each): the images of a fleet's
// recent batches. A forgotten one costs a DescribeTaskDefinition at its
// next use, never a second registration.
const imageCacheSize = 1 << 14

// imageEntry is one task definition the provider registered or found.
type imageEntry struct {
	family, image, class string
	arn                  string // "" until found or registered
	// pinned: a configured pool's (Spec.Class ""): never evicted, never
	// deregistered.
	pinned   bool
	state    providers.ImageState
	reason   string
	lastUsed time.Time
	elem     *list.Element // its place in lru (on-demand entries only)
}

// imageTable is the provider's memory of task definitions by family:
// every configured pool's, and at most max of on-demand pools (least
// recently used evicted first). Only a cache: a miss costs a look-up.
// Safe for concurrent use.
type imageTable struct {
	mu       sync.Mutex
	byFamily map[string]*imageEntry // guarded by mu
	lru      *list.List             // on-demand entries, most recently used first; guarded by mu
	max      int
}

func newImageTable(max int) *imageTable {
	return &imageTable{byFamily: map[string]*imageEntry{}, lru: list.New(), max: max}
}

// entry returns fam's entry for spec, made if absent, and marks it used
// (pinned when spec is a configured pool's). Called with mu held.
func (t *imageTable) entry(fam string, spec providers.Spec) *imageEntry {
	e := t.byFamily[fam]
	if e == nil {
		e = &imageEntry{family: fam, image: spec.Image, class: spec.Class}
		t.byFamily[fam] = e
	}
	if spec.Class == "" && !e.pinned {
		e.pinned = true
		if e.elem != nil {
			t.lru.Remove(e.elem)
			e.elem = nil
		}
	}
	if e.pinned {
		return e
	}
	if e.elem == nil {
		e.elem = t.lru.PushFront(e)
	} else {
		t.lru.MoveToFront(e.elem)
	}
	for t.lru.Len() > t.max {
		old := t.lru.Remove(t.lru.Back()).(*imageEntry)
		delete(t.byFamily, old.family)
	}
	return e
}

// known reports whether fam's task definition is known to exist, marking
// it used (and pinned for a configured pool).
func (t *imageTable) known(fam string, spec providers.Spec) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.byFamily[fam]; e == nil || e.arn == "" {
		return false
	}
	return t.entry(fam, spec).arn != ""
}

// pending records that fam's task definition is being looked up or
// registered (State pulling), unless it is known.
func (t *imageTable) pending(fam string, spec providers.Spec) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.entry(fam, spec); e.arn == "" {
		e.state, e.reason = providers.ImagePulling, ""
	}
}

// put records fam's task definition, found or registered, as ready.
func (t *imageTable) put(fam string, spec providers.Spec, arn string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(fam, spec)
	e.arn, e.state, e.reason = arn, providers.ImageReady, ""
}

// failed records why fam's image failed (its preparation, or its last
// task's pull); a known ARN stays (the task definition exists).
func (t *imageTable) failed(fam string, spec providers.Spec, reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(fam, spec)
	e.state, e.reason = providers.ImageFailed, reason
}

// launched marks fam's image used at now and returns its ARN; false when
// the table no longer holds it.
func (t *imageTable) launched(fam string, now time.Time) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.byFamily[fam]
	if e == nil || e.arn == "" {
		return "", false
	}
	e.lastUsed = now
	if e.elem != nil {
		t.lru.MoveToFront(e.elem)
	}
	return e.arn, true
}

// ran records that a task of the task definition arn ran: its image is
// ready again after a failed pull.
func (t *imageTable) ran(arn string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.byFamily[familyOf(arn)]; e != nil && e.arn == arn {
		e.state, e.reason = providers.ImageReady, ""
	}
}

// pullFailed records that a task of the task definition arn could not
// pull its image.
func (t *imageTable) pullFailed(arn, reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.byFamily[familyOf(arn)]; e != nil && e.arn == arn {
		e.state, e.reason = providers.ImageFailed, reason
	}
}

// pinned reports whether a configured pool uses fam.
func (t *imageTable) pinned(fam string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.byFamily[fam]
	return e != nil && e.pinned
}

// forget drops fam's entry if it holds arn (or none).
func (t *imageTable) forget(fam, arn string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.byFamily[fam]
	if e == nil || e.pinned || (e.arn != "" && e.arn != arn) {
		return
	}
	if e.elem != nil {
		t.lru.Remove(e.elem)
	}
	delete(t.byFamily, fam)
}

// info returns fam's entry as an ImageInfo.
func (t *imageTable) info(fam string) (providers.ImageInfo, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.byFamily[fam]
	if e == nil {
		return providers.ImageInfo{}, false
	}
	return e.info(), true
}

// list returns every entry as an ImageInfo, by image then family.
func (t *imageTable) list() []providers.ImageInfo {
	t.mu.Lock()
	entries := make([]*imageEntry, 0, len(t.byFamily))
	for _, e := range t.byFamily {
		entries = append(entries, e)
	}
	out := make([]providers.ImageInfo, 0, len(entries))
	slices.SortFunc(entries, func(a, b *imageEntry) int {
		if c := strings.Compare(a.image, b.image); c != 0 {
			return c
		}
		return strings.Compare(a.family, b.family)
	})
	for _, e := range entries {
		out = append(out, e.info())
	}
	t.mu.Unlock()
	return out
}

// info is the entry as an ImageInfo. Called with the table's mu held.
func (e *imageEntry) info() providers.ImageInfo {
	return providers.ImageInfo{Image: e.image, State: e.state, Reason: e.reason, Ref: e.arn, LastUsed: e.lastUsed, Pinned: e.pinned}
}
