package envclient

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestClient_SendsDocumentedRequests(t *testing.T) {
	type seen struct{ path, auth, body string }
	var got []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, seen{r.URL.Path, r.Header.Get("Authorization"), string(b)})
		switch r.URL.Path {
		case "/v1/envs":
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(`{"sandbox_id":"sbx-1","env_id":"game"}`))
		case "/v1/sandboxes/sbx-1/env/reset":
			_, _ = w.Write([]byte(`{"observation":"start","info":{}}`))
		case "/v1/sandboxes/sbx-1/env/step":
			w.WriteHeader(http.StatusConflict)
			_, _ = w.Write([]byte(`{"error":{"code":"episode_not_running","message":"call reset"}}`))
		default:
			_, _ = w.Write([]byte(`{}`))
		}
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := New(srv.URL+"/", "k1", srv.Client())

	id, err := c.Make(ctx, "game")
	require.NoError(t, err)
	assert.Equal(t, "sbx-1", id)
	s := int64(4)
	res, err := c.Reset(ctx, id, &s, map[string]int{"level": 2})
	require.NoError(t, err)
	assert.Equal(t, json.RawMessage(`"start"`), res.Observation)
	_, err = c.Step(ctx, id, 7)
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, Error{Status: http.StatusConflict, Code: "episode_not_running", Message: "call reset"}, *e)
	require.NoError(t, c.Close(ctx, id))

	assert.Equal(t, []seen{
		{"/v1/envs", "Bearer k1", `{"env_id":"game"}`},
		{"/v1/sandboxes/sbx-1/env/reset", "Bearer k1", `{"options":{"level":2},"seed":4}`},
		{"/v1/sandboxes/sbx-1/env/step", "Bearer k1", `{"action":7}`},
		{"/v1/sandboxes/sbx-1/env/close", "Bearer k1", ``},
	}, got)
}
