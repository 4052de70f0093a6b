package gateway

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/errclass"
)

func TestPreviewSigner_Verify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s := newTokenSigner(strings.Repeat("s", MinPreviewSecretLen))
	other := newTokenSigner(strings.Repeat("o", MinPreviewSecretLen))
	claims := previewClaims{Sandbox: "sbx-1", Port: 8000, Generation: 3, Owner: "owner", Expires: now.Add(time.Minute).Unix()}
	good := s.sign(claims)
	payload, sig, _ := strings.Cut(good, ".")
	tampered := claims
	tampered.Port = 9000
	tamperedPayload, _, _ := strings.Cut(s.sign(tampered), ".")
	tests := []struct {
		name string
		tok  string
		id   string
		port int
		now  time.Time
		msg  string // "" accepts
	}{
		{name: "valid", tok: good, id: "sbx-1", port: 8000, now: now},
		{name: "valid until the last second", tok: good, id: "sbx-1", port: 8000, now: now.Add(time.Minute - time.Nanosecond)},
		{name: "expired", tok: good, id: "sbx-1", port: 8000, now: now.Add(time.Minute), msg: "expired at"},
		{name: "other port", tok: good, id: "sbx-1", port: 8001, now: now, msg: "for port 8000, not 8001"},
		{name: "other sandbox", tok: good, id: "sbx-2", port: 8000, now: now, msg: "another sandbox"},
		{name: "signed with another secret", tok: other.sign(claims), id: "sbx-1", port: 8000, now: now, msg: "signature does not match"},
		{name: "payload changed under its signature", tok: tamperedPayload + "." + sig, id: "sbx-1", port: 9000, now: now, msg: "signature does not match"},
		{name: "signature cut", tok: payload + "." + sig[:len(sig)-2], id: "sbx-1", port: 8000, now: now, msg: "signature does not match"},
		{name: "no signature", tok: payload, id: "sbx-1", port: 8000, now: now, msg: "malformed"},
		{name: "too long", tok: strings.Repeat("a", maxPreviewToken) + "." + sig, id: "sbx-1", port: 8000, now: now, msg: "malformed"},
		{name: "empty", tok: "", id: "sbx-1", port: 8000, now: now, msg: "malformed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.verify(tc.tok, tc.id, tc.port, tc.now)
			if tc.msg == "" {
				require.NoError(t, err)
				assert.Equal(t, claims, got)
			} else {
				require.Error(t, err)
				a := errclass.Of(err)
				assert.Equal(t, 401, a.Status)
				assert.Contains(t, a.Message, "preview URL refused")
				assert.Contains(t, a.Message, tc.msg)
			}
		})
	}
}

func TestPreviewConfig_Validate(t *testing.T) {
	tests := []struct {
		name string
		cfg  PreviewConfig
		err  string
	}{
		{name: "defaults", cfg: PreviewConfig{}},
		{name: "short secret", cfg: PreviewConfig{PreviewSecret: "short"}, err: "QUARRY_PREVIEW_SECRET"},
		{name: "max ttl under a second", cfg: PreviewConfig{PreviewMaxTTL: time.Millisecond}, err: "QUARRY_PREVIEW_MAX_TTL"},
		{name: "default over max", cfg: PreviewConfig{PreviewMaxTTL: time.Minute, PreviewDefaultTTL: time.Hour}, err: "QUARRY_PREVIEW_DEFAULT_TTL"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.validate()
			if tc.err == "" {
				assert.NoError(t, err)
			} else {
				assert.ErrorContains(t, err, tc.err)
			}
		})
	}
	d := PreviewConfig{}.withDefaults()
	assert.Equal(t, 24*time.Hour, d.PreviewMaxTTL)
	assert.Equal(t, time.Hour, d.PreviewDefaultTTL)
}
