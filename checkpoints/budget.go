package checkpoints

import (
	"context"
	"fmt"
	"io"
	"math"
)

// Budget is how many archive bytes a store keeps: per owner and in all.
// A field of 0 or less is no limit. Every store counts by the same rules
// (Usage), in the commit that makes a checkpoint visible or removes it, so
// the count is exact whatever races:
//   - A Put counts when it returns nil, and not before: one that fails or
//     is refused counts nothing. Concurrent Puts never together pass a
//     limit (each is checked against the count that includes the others).
//   - Each stored blob counts once per owner who holds it: an owner's
//     checkpoints of the same bytes count once in a content-addressed
//     store (filestore), each once in a store of one object per checkpoint
//     (s3store). An owner's usage never depends on another owner's
//     checkpoints, so the total is the sum of the owners' usages: a blob
//     two owners hold counts twice in it.
//   - Delete and Purge free an owner's bytes of a blob when they remove
//     the owner's last checkpoint of it. An expired checkpoint counts until
//     Purge removes it: its bytes are stored until then.
type Budget struct {
	// PerOwner is the most bytes one owner's checkpoints take.
	PerOwner int64
	// Total is the most bytes all checkpoints take.
	Total int64
}

// Usage is what a store counts against its Budget.
type Usage struct {
	Owner int64 // the owner's bytes
	Total int64 // every owner's bytes
}

// BudgetScope names a limit of Budget.
type BudgetScope string

// The limits of a Budget.
const (
	ScopeOwner BudgetScope = "per-owner" // Budget.PerOwner
	ScopeTotal BudgetScope = "total"     // Budget.Total
)

// BudgetError is the refusal of a Put over the store's Budget: which limit,
// its bytes, what was counted against it and what the archive needed.
// errors.Is(err, ErrOverBudget) holds.
type BudgetError struct {
	Scope BudgetScope
	Limit int64
	Used  int64 // counted against Limit when the Put was refused
	// Need is what the archive would have added. With AtLeast it is a
	// lower bound: the Put stopped reading once the archive passed what
	// the budget left.
	Need    int64
	AtLeast bool
}

func (e *BudgetError) Error() string {
	need := fmt.Sprintf("the archive needs %d", e.Need)
	switch {
	case e.AtLeast && e.Need == 0:
		need = "nothing more fits"
	case e.AtLeast:
		need = fmt.Sprintf("the archive needs at least %d", e.Need)
	}
	return fmt.Sprintf("%s: the %s limit is %d bytes, %d are counted and %s", ErrOverBudget, e.Scope, e.Limit, e.Used, need)
}

func (e *BudgetError) Unwrap() error { return ErrOverBudget }

// Variable names the variable of Config that sets the limit.
func (e *BudgetError) Variable() string {
	if e.Scope == ScopeOwner {
		return "QUARRY_CHECKPOINT_BUDGET_PER_KEY"
	}
	return "QUARRY_CHECKPOINT_BUDGET_TOTAL"
}

// limit is one limit of a Budget with its usage.
type limit struct {
	scope       BudgetScope
	bytes, used int64
}

func (b Budget) limits(u Usage) [2]limit {
	return [2]limit{{ScopeOwner, b.PerOwner, u.Owner}, {ScopeTotal, b.Total, u.Total}}
}

// tightest returns the limit with the least room at u, and that room
// (math.MaxInt64 with no limit; negative when one is passed already).
func (b Budget) tightest(u Usage) (limit, int64) {
	var best limit
	room := int64(math.MaxInt64)
	for _, l := range b.limits(u) {
		if l.bytes > 0 && l.bytes-l.used < room {
			best, room = l, l.bytes-l.used
		}
	}
	return best, room
}

// Check returns nil when n more bytes fit into b at u, and otherwise a
// *BudgetError naming the first limit they pass (the owner's, then the
// total).
func (b Budget) Check(u Usage, n int64) error {
	for _, l := range b.limits(u) {
		if l.bytes > 0 && n > l.bytes-l.used {
			return &BudgetError{Scope: l.scope, Limit: l.bytes, Used: l.used, Need: n}
		}
	}
	return nil
}

// Reader returns the DigestReader a Put copies r through when its owner's
// usage is u: it allows maxBytes or what b leaves at u, whichever is less,
// so that a Put over budget stops reading early. Past maxBytes it fails
// with ErrTooLarge; past the budget's room with a *BudgetError (AtLeast).
// A budget passed already is a *BudgetError before anything is read. The
// room at u is not a reservation: the store's commit checks again.
func (b Budget) Reader(ctx context.Context, r io.Reader, maxBytes int64, u Usage) (*DigestReader, error) {
	l, room := b.tightest(u)
	if room < 0 {
		return nil, &BudgetError{Scope: l.scope, Limit: l.bytes, Used: l.used, Need: 0, AtLeast: true}
	}
	if room >= maxBytes {
		return NewDigestReader(ctx, r, maxBytes), nil
	}
	d := NewDigestReader(ctx, r, room)
	d.over = func() error {
		return &BudgetError{Scope: l.scope, Limit: l.bytes, Used: l.used, Need: room + 1, AtLeast: true}
	}
	return d, nil
}
