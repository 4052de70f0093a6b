package checkpoints_test

import (
	"bytes"
	"context"
	"io"
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/checkpoints"
)

func TestBudget_Check(t *testing.T) {
	owner := func(limit, used, need int64) error {
		return &checkpoints.BudgetError{Scope: checkpoints.ScopeOwner, Limit: limit, Used: used, Need: need}
	}
	total := func(limit, used, need int64) error {
		return &checkpoints.BudgetError{Scope: checkpoints.ScopeTotal, Limit: limit, Used: used, Need: need}
	}
	tests := []struct {
		name   string
		budget checkpoints.Budget
		used   checkpoints.Usage
		n      int64
		want   error
	}{
		{name: "no limit", budget: checkpoints.Budget{}, used: checkpoints.Usage{Owner: 1 << 50, Total: 1 << 60}, n: 1 << 40},
		{name: "fits exactly", budget: checkpoints.Budget{PerOwner: 100, Total: 200}, used: checkpoints.Usage{Owner: 60, Total: 150}, n: 40},
		{name: "one byte over the owner's", budget: checkpoints.Budget{PerOwner: 100, Total: 200}, used: checkpoints.Usage{Owner: 60, Total: 60}, n: 41, want: owner(100, 60, 41)},
		{name: "over the total", budget: checkpoints.Budget{PerOwner: 100, Total: 200}, used: checkpoints.Usage{Owner: 10, Total: 190}, n: 11, want: total(200, 190, 11)},
		{name: "over both: the owner's is named", budget: checkpoints.Budget{PerOwner: 100, Total: 100}, used: checkpoints.Usage{Owner: 90, Total: 90}, n: 20, want: owner(100, 90, 20)},
		{name: "nothing more fits nothing", budget: checkpoints.Budget{PerOwner: 100}, used: checkpoints.Usage{Owner: 100}, n: 0},
		{name: "a lowered limit refuses even nothing", budget: checkpoints.Budget{Total: 100}, used: checkpoints.Usage{Total: 150}, n: 0, want: total(100, 150, 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.budget.Check(tt.used, tt.n)
			assert.Equal(t, tt.want, err)
			if tt.want != nil {
				assert.ErrorIs(t, err, checkpoints.ErrOverBudget)
			}
		})
	}
}

func TestBudget_ReaderStopsAtTheTighterLimit(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 1000)
	tests := []struct {
		name     string
		budget   checkpoints.Budget
		used     checkpoints.Usage
		maxBytes int64
		want     error // nil: reads to the end
		tooLarge bool
	}{
		{name: "room for it", budget: checkpoints.Budget{PerOwner: 5000}, used: checkpoints.Usage{Owner: 4000}, maxBytes: 1 << 20},
		{name: "the owner's room ends first", budget: checkpoints.Budget{PerOwner: 5000, Total: 9000}, used: checkpoints.Usage{Owner: 4500, Total: 8000}, maxBytes: 1 << 20,
			want: &checkpoints.BudgetError{Scope: checkpoints.ScopeOwner, Limit: 5000, Used: 4500, Need: 501, AtLeast: true}},
		{name: "the total's room ends first", budget: checkpoints.Budget{PerOwner: 5000, Total: 9000}, used: checkpoints.Usage{Owner: 100, Total: 8800}, maxBytes: 1 << 20,
			want: &checkpoints.BudgetError{Scope: checkpoints.ScopeTotal, Limit: 9000, Used: 8800, Need: 201, AtLeast: true}},
		{name: "maxBytes ends first", budget: checkpoints.Budget{PerOwner: 5000}, maxBytes: 999, tooLarge: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := &countingReader{r: bytes.NewReader(data)}
			d, err := tt.budget.Reader(context.Background(), src, tt.maxBytes, tt.used)
			require.NoError(t, err)
			_, err = io.Copy(io.Discard, d)
			switch {
			case tt.tooLarge:
				assert.ErrorIs(t, err, checkpoints.ErrTooLarge)
				assert.NotErrorIs(t, err, checkpoints.ErrOverBudget)
			case tt.want != nil:
				assert.Equal(t, tt.want, err)
				var be *checkpoints.BudgetError
				require.ErrorAs(t, err, &be)
				assert.LessOrEqual(t, src.n, be.Need, "it reads no further than one byte past the room")
			default:
				require.NoError(t, err)
				assert.Equal(t, int64(len(data)), d.Size())
			}
		})
	}
	_, err := checkpoints.Budget{Total: 100}.Reader(context.Background(), bytes.NewReader(data), 1<<20, checkpoints.Usage{Total: 101})
	assert.Equal(t, &checkpoints.BudgetError{Scope: checkpoints.ScopeTotal, Limit: 100, Used: 101, AtLeast: true}, err, "a budget passed already refuses before reading")
}

func TestBudgetError_MessageAndVariable(t *testing.T) {
	e := &checkpoints.BudgetError{Scope: checkpoints.ScopeOwner, Limit: 1000, Used: 900, Need: 101, AtLeast: true}
	assert.Equal(t, "checkpoint budget spent: the per-owner limit is 1000 bytes, 900 are counted and the archive needs at least 101", e.Error())
	assert.Equal(t, "checkpoint budget spent: the total limit is 10 bytes, 11 are counted and nothing more fits",
		(&checkpoints.BudgetError{Scope: checkpoints.ScopeTotal, Limit: 10, Used: 11, AtLeast: true}).Error())
	// Variable names the field of Config that sets each limit.
	cfg := reflect.TypeOf(checkpoints.Config{})
	for scope, field := range map[checkpoints.BudgetScope]string{checkpoints.ScopeOwner: "BudgetPerKey", checkpoints.ScopeTotal: "BudgetTotal"} {
		f, ok := cfg.FieldByName(field)
		require.True(t, ok, field)
		assert.Equal(t, f.Tag.Get("envconfig"), (&checkpoints.BudgetError{Scope: scope}).Variable(), scope)
	}
}

func TestConfig_Budget(t *testing.T) {
	const disk = 100 << 30
	tests := []struct {
		name string
		cfg  checkpoints.Config
		fs   int64
		want checkpoints.Budget
	}{
		{name: "unset, embedded: half the file system", fs: disk, want: checkpoints.Budget{Total: disk / 2}},
		{name: "unset, s3: none", want: checkpoints.Budget{}},
		{name: "set", cfg: checkpoints.Config{BudgetPerKey: 5 << 30, BudgetTotal: 20 << 30}, fs: disk, want: checkpoints.Budget{PerOwner: 5 << 30, Total: 20 << 30}},
		{name: "-1 is none", cfg: checkpoints.Config{BudgetPerKey: -1, BudgetTotal: -1}, fs: disk, want: checkpoints.Budget{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.cfg.Budget(tt.fs))
		})
	}
	err := checkpoints.Config{BudgetPerKey: -2, BudgetTotal: -5}.Validate()
	require.Error(t, err)
	assert.ErrorContains(t, err, "QUARRY_CHECKPOINT_BUDGET_PER_KEY: -2")
	assert.ErrorContains(t, err, "QUARRY_CHECKPOINT_BUDGET_TOTAL: -5")
	assert.NoError(t, checkpoints.Config{BudgetPerKey: -1, BudgetTotal: 1}.Validate())
}
