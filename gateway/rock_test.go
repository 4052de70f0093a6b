package gateway

import (
	"encoding/base64"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/valyala/fasthttp"
)

func TestRockKey_EveryWayTheSDKSendsIt(t *testing.T) {
	basic := func(user, pass string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	}
	for _, tc := range []struct {
		name    string
		headers map[string]string
		key     string
	}{
		{name: "bearer", headers: map[string]string{"Authorization": "Bearer k1"}, key: "k1"},
		{name: "basic from a base URL with userinfo", headers: map[string]string{"Authorization": basic("rock", "k2")}, key: "k2"},
		{name: "basic with an empty password", headers: map[string]string{"Authorization": basic("rock", "")}},
		{name: "xrl bearer", headers: map[string]string{"XRL-Authorization": "Bearer k3"}, key: "k3"},
		{name: "xrl raw", headers: map[string]string{"XRL-Authorization": "k4"}, key: "k4"},
		{name: "x-key", headers: map[string]string{"X-Key": "k5"}, key: "k5"},
		{name: "x-api-key", headers: map[string]string{"X-API-Key": " k6 "}, key: "k6"},
		{name: "authorization wins", headers: map[string]string{"Authorization": "Bearer k7", "X-Key": "other"}, key: "k7"},
		{name: "none", headers: map[string]string{"X-User-Id": "u"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h fasthttp.RequestHeader
			for k, v := range tc.headers {
				h.Set(k, v)
			}
			key, ok := rockKey(&h)
			assert.Equal(t, tc.key != "", ok)
			assert.Equal(t, tc.key, string(key))
		})
	}
}
