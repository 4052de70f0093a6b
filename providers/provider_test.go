package providers

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheckNames(t *testing.T) {
	spec := Spec{Pool: "p", Image: "img"}
	noDots := func(n string) error {
		if n == "" || n[0] == '.' {
			return errors.New("bad start")
		}
		return nil
	}
	tests := []struct {
		name  string
		names []string
		want  string
	}{
		{name: "fine", names: []string{"a", "b"}},
		{name: "none", names: nil},
		{name: "invalid", names: []string{"a", ".b"}, want: `names[1] ".b": bad start`},
		{name: "repeated", names: []string{"a", "b", "a"}, want: `names[2] "a": repeated`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckNames(spec, tt.names, noDots)
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalidSpec)
			var le *LaunchError
			require.ErrorAs(t, err, &le)
			assert.Equal(t, "p", le.Pool)
			assert.Contains(t, le.Reason, tt.want)
		})
	}
}
