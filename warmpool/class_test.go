package warmpool_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/warmpool"
)

func TestParseImageRef_NormalizesAsTheEngine(t *testing.T) {
	for _, tc := range []struct{ in, want, registry string }{
		{"python:3.11", "docker.io/library/python:3.11", "docker.io"},
		{"python", "docker.io/library/python:latest", "docker.io"},
		{"swebench/sweb.eval.x86_64.django:v1", "docker.io/swebench/sweb.eval.x86_64.django:v1", "docker.io"},
		{"127.0.0.1:5000/team/task-1:v2", "127.0.0.1:5000/team/task-1:v2", "127.0.0.1:5000"},
		{"localhost/x", "localhost/x:latest", "localhost"},
		{"ghcr.io/a/b@sha256:" + strings.Repeat("ab", 32), "ghcr.io/a/b@sha256:" + strings.Repeat("ab", 32), "ghcr.io"},
	} {
		ref, err := warmpool.ParseImageRef(tc.in)
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, ref.String(), tc.in)
		assert.Equal(t, tc.registry, ref.Registry(), tc.in)
	}
	for _, bad := range []string{"", "UPPER", "a b", "x:", strings.Repeat("a", 600), "x@sha256:short"} {
		_, err := warmpool.ParseImageRef(bad)
		assert.Error(t, err, "%q", bad)
	}
}

func TestImagePattern_Match(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		yes, no []string
	}{
		{"*", []string{"python:3", "127.0.0.1:5000/a/b:c"}, nil},
		{"python:*", []string{"python:3.11", "docker.io/library/python:3.12"}, []string{"pypy:3", "other/python:3"}},
		{"python", []string{"python:3.11", "python@sha256:" + strings.Repeat("0", 64)}, []string{"pythonx:1"}},
		{"127.0.0.1:5000/**", []string{"127.0.0.1:5000/a:1", "127.0.0.1:5000/a/b/c:1"}, []string{"127.0.0.1:5001/a:1", "docker.io/library/a:1"}},
		{"127.0.0.1:*/swe/*", []string{"127.0.0.1:5000/swe/t1:v1"}, []string{"127.0.0.1:5000/swe/deep/t1:v1"}},
		{"swebench/*:v1", []string{"swebench/django:v1"}, []string{"swebench/django:v2", "other/django:v1"}},
		{"ghcr.io/org/**:release-*", []string{"ghcr.io/org/a/b:release-1"}, []string{"ghcr.io/org/a:dev"}},
	} {
		p, err := warmpool.ParseImagePattern(tc.pattern)
		require.NoError(t, err, tc.pattern)
		for _, s := range tc.yes {
			ref, err := warmpool.ParseImageRef(s)
			require.NoError(t, err)
			assert.True(t, p.Match(ref), "%s should match %s", tc.pattern, s)
		}
		for _, s := range tc.no {
			ref, err := warmpool.ParseImageRef(s)
			require.NoError(t, err)
			assert.False(t, p.Match(ref), "%s should not match %s", tc.pattern, s)
		}
	}
	for _, bad := range []string{"", "a?b", "[x]", "x:"} {
		_, err := warmpool.ParseImagePattern(bad)
		assert.Error(t, err, "%q", bad)
	}
}

func TestOnDemandPoolName_StableValidAndDistinct(t *testing.T) {
	ref, err := warmpool.ParseImageRef("python:3.11")
	require.NoError(t, err)
	a := warmpool.OnDemandPoolName("default", ref, 1, 1024, 0)
	assert.Equal(t, a, warmpool.OnDemandPoolName("default", ref, 1, 1024, 0), "every replica names it alike")
	assert.Regexp(t, `^i-[a-z2-7]{24}$`, a)
	for _, other := range []string{
		warmpool.OnDemandPoolName("big", ref, 1, 1024, 0),
		warmpool.OnDemandPoolName("default", ref, 2, 1024, 0),
		warmpool.OnDemandPoolName("default", ref, 1, 2048, 0),
		warmpool.OnDemandPoolName("default", ref, 1, 1024, 10),
	} {
		assert.NotEqual(t, a, other)
	}
}

func TestParsePoolsFile_Classes(t *testing.T) {
	doc, err := warmpool.ParsePoolsFile([]byte(`
pools:
  - {name: default, max_total: 2}
classes:
  - name: swe
    provider: docker
    memory: 1Gi
    max_memory: 4Gi
    max_cpu: 2
    max_total: 200
    max_per_image: 8
    images: ["127.0.0.1:5000/**", "python:*"]
    warm_max: 0
  - name: default
    max_total: 10
`))
	require.NoError(t, err)
	require.Len(t, doc.Classes, 2)
	swe := doc.Classes[0]
	assert.Equal(t, 1024, int(swe.MaxMemory)/4)
	assert.Equal(t, 0, *swe.WarmMax, "an explicit 0 keeps no pool warm")
	assert.Equal(t, 8, swe.MaxPerImage)
	def := doc.Classes[1]
	assert.Equal(t, []string{"*"}, def.Images, "every image by default")
	assert.Equal(t, 10, def.MaxPerImage, "max_per_image defaults to max_total")
	assert.Equal(t, warmpool.DefaultWarmMax, *def.WarmMax)
	assert.Equal(t, 1.0, def.MaxCPU, "a request may ask for the class's size, not more, by default")

	for _, tc := range []struct{ name, doc, field string }{
		{"bad pattern", `{"pools":[{"name":"p","max_total":1}],"classes":[{"name":"c","max_total":1,"images":["a?b"]}]}`, "classes[0].images[0]"},
		{"max below default", `{"pools":[{"name":"p","max_total":1}],"classes":[{"name":"c","max_total":1,"cpu":2,"max_cpu":1}]}`, "classes[0].max_cpu"},
		{"per image above total", `{"pools":[{"name":"p","max_total":1}],"classes":[{"name":"c","max_total":2,"max_per_image":3}]}`, "classes[0].max_per_image"},
		{"duplicate", `{"pools":[{"name":"p","max_total":1}],"classes":[{"name":"c","max_total":1},{"name":"c","max_total":1}]}`, "classes[1].name"},
		{"no total", `{"pools":[{"name":"p","max_total":1}],"classes":[{"name":"c"}]}`, "classes[0].max_total"},
		{"a pool named like an on-demand one", `{"pools":[{"name":"i-x","max_total":1}]}`, "pools[0].name"},
		{"unknown field", `{"pools":[{"name":"p","max_total":1}],"classes":[{"name":"c","max_total":1,"imgs":[]}]}`, "imgs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := warmpool.ParsePoolsFile([]byte(tc.doc))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.field)
		})
	}
}
