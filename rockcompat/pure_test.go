package rockcompat

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
)

func TestDecodeText_PythonModes(t *testing.T) {
	for _, tc := range []struct {
		name, enc, mode string
		in              []byte
		want            string
		wantErr         bool
	}{
		{name: "utf-8", enc: "utf-8", mode: "strict", in: []byte("héllo"), want: "héllo"},
		{name: "utf-8 strict refuses", enc: "utf-8", mode: "strict", in: []byte{'a', 0xff}, wantErr: true},
		{name: "utf-8 replace", enc: "utf-8", mode: "replace", in: []byte{'a', 0xff, 'b'}, want: "a\uFFFDb"},
		{name: "utf-8 ignore", enc: "utf-8", mode: "ignore", in: []byte{'a', 0xff, 'b'}, want: "ab"},
		{name: "latin-1", enc: "latin-1", mode: "strict", in: []byte{'a', 0xe9, 0x00}, want: "aé\x00"},
		{name: "ascii strict refuses", enc: "ascii", mode: "strict", in: []byte{0xe9}, wantErr: true},
		{name: "ascii ignore", enc: "ascii", mode: "ignore", in: []byte{'a', 0xe9}, want: "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeText(tc.in, tc.enc, tc.mode)
			if tc.wantErr {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestService_PoolFor(t *testing.T) {
	pools := []warmpool.PoolConfig{
		{Name: "default", Image: "host"},
		{Name: "py", Image: "python:3.12"},
		{Name: "swe", Image: "swe/django:1"},
	}
	s := &Service{cfg: Config{Images: map[string]string{"mapped:1": "swe", "broken:1": "gone"}}.WithDefaults()}
	for _, tc := range []struct {
		name, image, pool, err string
	}{
		{name: "mapping table", image: "mapped:1", pool: "swe"},
		{name: "mapping to an unknown pool", image: "broken:1", err: `maps to pool "gone"`},
		{name: "pool name", image: "py", pool: "py"},
		{name: "pool image", image: "python:3.12", pool: "py"},
		{name: "sdk default image", image: SDKDefaultImage, pool: "default"},
		{name: "empty image", image: "", pool: "default"},
		{name: "unknown image", image: "other:1", err: `no pool serves image "other:1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := s.poolFor(tc.image, pools)
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.pool, p.Name)
		})
	}
}

func TestCheckSession(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"default", true}, {"bash-1700000000000000000", true}, {"my.session_1-x", true},
		{"", false}, {".hidden", false}, {"a/b", false}, {"../x", false}, {"sp ace", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.ok, checkSession(tc.name) == nil)
		})
	}
}

func TestService_CommandTimeout(t *testing.T) {
	s := &Service{cfg: Config{MaxCommandTimeout: time.Hour, TimeoutMargin: 10 * time.Second}.WithDefaults()}
	f := func(v float64) *float64 { return &v }
	for _, tc := range []struct {
		name  string
		secs  *float64
		ms    int64
		bound time.Duration
	}{
		{name: "none: the agent's default", secs: nil, ms: 0, bound: agentDefaultTimeout + 10*time.Second},
		{name: "zero: the agent's default", secs: f(0), ms: 0, bound: agentDefaultTimeout + 10*time.Second},
		{name: "seconds", secs: f(1.5), ms: 1500, bound: 1500*time.Millisecond + 10*time.Second},
		{name: "capped", secs: f(1e300), ms: time.Hour.Milliseconds(), bound: time.Hour + 10*time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms, bound := s.commandTimeout(tc.secs)
			assert.Equal(t, tc.ms, ms)
			assert.Equal(t, tc.bound, bound)
		})
	}
}

func TestParseImages(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     map[string]string
		err      string
	}{
		{name: "empty", in: " "},
		{name: "pairs", in: "python:3.11=py, swe/django:1=swe", want: map[string]string{"python:3.11": "py", "swe/django:1": "swe"}},
		{name: "no pool", in: "python:3.11=", err: "is not image=pool"},
		{name: "no pair", in: "python", err: "is not image=pool"},
		{name: "twice", in: "a=x,a=y", err: "mapped twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseImages(tc.in)
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}
