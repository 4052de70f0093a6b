//go:build integration

package tests

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quarryhq/quarry/client"
	"github.com/quarryhq/quarry/execagent/agentapi"
	"github.com/quarryhq/quarry/internal/testenv"
	"github.com/quarryhq/quarry/modelservice/modeltest"
)

// envScreenshots names a directory (relative to the repository's root, or
// absolute) where TestConsole_Browser writes a PNG of each page it shows:
// QUARRY_UI_SCREENSHOTS=docs/console.
const envScreenshots = "QUARRY_UI_SCREENSHOTS"

// The page's size for the test (and its screenshots).
const shotWidth, shotHeight = 1280, 800

// browserLog collects what the page writes to its console. Errors fail the
// test: uncaught exceptions, console.error calls (the CSP listener below
// makes one of every violation) and error entries of the browser log. The
// only network errors it lets by are those the test causes on purpose: a
// refused connection or WebSocket while the gateway restarts, and the 401
// of the wrong key at sign-in.
type browserLog struct {
	mu         sync.Mutex
	errors     []string
	all        []string
	violations atomic.Int64
}

// expectedNetworkError reports whether a network error of the browser log
// is one the test causes.
func expectedNetworkError(m chromedp.ConsoleMessage) bool {
	switch {
	case m.Source != "network" && !strings.Contains(m.Text, "WebSocket connection to"):
		return false
	case strings.Contains(m.Text, "net::ERR_CONNECTION_REFUSED"), strings.Contains(m.Text, "net::ERR_CONNECTION_RESET"),
		strings.Contains(m.Text, "net::ERR_EMPTY_RESPONSE"):
		return true // the gateway restarting
	case strings.Contains(m.Text, "WebSocket connection to") && strings.Contains(m.Text, "/pty?pty="):
		return true // the terminal's socket while the gateway restarts
	case strings.Contains(m.Text, "status of 401") && strings.HasSuffix(m.URL, "/v1/pools"):
		return true // the wrong key at sign-in
	case strings.Contains(m.Text, "status of 404") && strings.Contains(m.URL, "/v1/sandboxes/"+missingSandbox):
		return true // the page of a sandbox that does not exist
	}
	return false
}

func (b *browserLog) add(m chromedp.ConsoleMessage) {
	line := fmt.Sprintf("[%s %s] %s (%s:%d)", m.Type, m.Source, m.Text, m.URL, m.Line+1)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.all = append(b.all, line)
	if strings.Contains(m.Text, "CSP violation") || strings.Contains(m.Text, "Content Security Policy") {
		b.violations.Add(1)
	}
	switch {
	case m.IsException():
	case m.Type != chromedp.ConsoleError:
		return
	case expectedNetworkError(m):
		return
	}
	b.errors = append(b.errors, line)
}

func (b *browserLog) snapshot() (errs, all []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.errors...), append([]string(nil), b.all...)
}

// missingSandbox is the id of a sandbox that does not exist, whose page the test opens.
const missingSandbox = "sbx-doesnotexist"

// cspListener runs before the console's own scripts in every document (a
// DevTools script, which the page's CSP does not govern) and turns each
// Content-Security-Policy violation into a console error.
const cspListener = `document.addEventListener('securitypolicyviolation', (e) => {
  console.error('CSP violation: ' + e.violatedDirective + ' blocked ' + (e.blockedURI || 'inline') +
    ' at ' + e.sourceFile + ':' + e.lineNumber + ' ' + (e.sample || ''));
});`

// TestConsole_Browser drives the web console in a real headless Chromium
// against a real gateway (process provider, real agents and bash): sign in
// (a wrong key first), the pools page with the live counts, a new sandbox,
// a command typed into the terminal and its output read from the page, a
// gateway restart that the page and the terminal ride out, a file uploaded
// and downloaded (the bytes checked), viewed (binary: said so, downloaded
// from there) and a text file viewed, a process followed, a checkpoint
// made and restored, the sandbox filtered in the list, the lease released
// (no actions left), the page of a sandbox that does not exist (said so,
// no actions, no call again). Any CSP violation or JavaScript error fails it.
func TestConsole_Browser(t *testing.T) {
	chromium := testenv.Chromium(t)
	g := startGateway(t, defaultPools)
	g.waitReady("default", 1)
	api := g.client()

	shots := os.Getenv(envScreenshots)
	if shots != "" && !filepath.IsAbs(shots) {
		shots = filepath.Join("..", shots)
	}
	if shots != "" {
		require.NoError(t, os.MkdirAll(shots, 0o755))
	}
	downloads := t.TempDir()

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.NoSandbox, // the tests run as root
		chromedp.WindowSize(1280, 900),
		chromedp.UserDataDir(t.TempDir()),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(cancelBrowser)
	bctx, cancelTimeout := context.WithTimeout(bctx, 4*time.Minute)
	t.Cleanup(cancelTimeout)

	// Start the browser and the tab, then listen to its console from the start.
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate("about:blank"), chromedp.EmulateViewport(shotWidth, shotHeight)))
	var blog browserLog
	listenCtx, stopListening := context.WithCancel(bctx)
	listened := make(chan struct{})
	messages := chromedp.Console(listenCtx)
	go func() {
		defer close(listened)
		for m, err := range messages {
			if err != nil {
				return
			}
			blog.add(m)
		}
	}()
	t.Cleanup(func() { stopListening(); <-listened })
	_, err := chromedp.Call(bctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: cspListener})
	require.NoError(t, err)
	_, err = chromedp.CallBrowser(bctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
		Behavior: browser.SetDownloadBehaviorBehaviorAllow, DownloadPath: downloads,
	})
	require.NoError(t, err)

	do := func(t *testing.T, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		require.NoError(t, chromedp.Do(bctx, steps...))
	}
	// waitJS waits (up to d) until the expression is truthy in the page.
	waitJS := func(t *testing.T, d time.Duration, what, expr string) {
		t.Helper()
		_, err := chromedp.Run(bctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(d)))
		if err != nil {
			body, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.body.innerText`))
			require.NoError(t, err, "waiting for %s (%s); the page shows:\n%s", what, expr, body)
		}
	}
	text := func(t *testing.T, expr string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.Evaluate[string](expr))
		require.NoError(t, err, expr)
		return s
	}
	shot := func(t *testing.T, name string) {
		t.Helper()
		if shots == "" {
			return
		}
		time.Sleep(300 * time.Millisecond) // let the last paint land
		png, err := chromedp.Run(bctx, chromedp.CaptureScreenshot())
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644))
	}
	terminalHas := func(s string) string {
		return fmt.Sprintf(`(document.querySelector('#terminal .xterm-rows') || {textContent: ''}).textContent.includes(%q)`, s)
	}
	typeInTerminal := func(t *testing.T, line string) {
		t.Helper()
		do(t, chromedp.Focus(chromedp.CSS("#terminal .xterm-helper-textarea")))
		for _, r := range line + "\r" {
			for _, ev := range keystroke(r) {
				_, err := chromedp.Call(bctx, input.DispatchKeyEvent, ev)
				require.NoError(t, err)
			}
		}
	}

	base := g.url() + "/ui"
	var sbxID string

	// Signing in and opening a sandbox are what every later step needs.
	require.True(t, t.Run("sign in", func(t *testing.T) {
		do(t, chromedp.Navigate(base), chromedp.WaitVisible(chromedp.ID("apikey")),
			chromedp.SendKeys(chromedp.ID("apikey"), "not-the-key"), chromedp.Click(chromedp.ID("signin-submit")))
		waitJS(t, 10*time.Second, "the refusal", `document.getElementById('signin-error').textContent.includes('refused')`)
		assert.Equal(t, "", text(t, `sessionStorage.getItem('quarry.apiKey') || ''`), "a refused key is not kept")
		shot(t, "signin")

		do(t, chromedp.Evaluate[chromedp.Void](`document.getElementById('apikey').value = ''`),
			chromedp.SendKeys(chromedp.ID("apikey"), g.key), chromedp.Click(chromedp.ID("signin-submit")))
		waitJS(t, 10*time.Second, "the pools page", `document.querySelector('#pools-body tr[data-pool="default"]')`)
		assert.Equal(t, g.key, text(t, `sessionStorage.getItem('quarry.apiKey')`), "the key is in sessionStorage")
		assert.Equal(t, "0", text(t, `String(localStorage.length)`), "nothing in localStorage")
		assert.Equal(t, "", text(t, `document.cookie`), "no cookie")
		assert.NotContains(t, text(t, `location.href`), g.key, "the key is never in the URL")
	}))

	t.Run("pools page shows the live counts", func(t *testing.T) {
		read := func() (map[string]int, error) {
			out := map[string]int{}
			for _, k := range []string{"ready", "launching", "leased", "stopping"} {
				s, err := chromedp.Run(bctx, chromedp.Evaluate[string](fmt.Sprintf(
					`(document.querySelector('#pools-body tr[data-pool="default"] td[data-count=%q]') || {textContent: ''}).textContent`, k)))
				if err != nil {
					return nil, err
				}
				n, err := strconv.Atoi(s)
				if err != nil {
					return nil, fmt.Errorf("%s count %q: %w", k, s, err)
				}
				out[k] = n
			}
			return out, nil
		}
		eventuallyEvery(t, 30*time.Second, 500*time.Millisecond, "the page's counts match the API's", func() error {
			pools, err := api.Pools(context.Background())
			if err != nil {
				return err
			}
			shown, err := read()
			if err != nil {
				return err
			}
			for _, p := range pools {
				if p.Name != "default" {
					continue
				}
				want := map[string]int{"ready": p.Ready, "launching": p.Launching, "leased": p.Leased, "stopping": p.Stopping}
				if fmt.Sprint(want) != fmt.Sprint(shown) {
					return fmt.Errorf("page %v, API %v", shown, want)
				}
				if p.Ready < 1 {
					return fmt.Errorf("no ready sandbox yet: %v", want)
				}
				return nil
			}
			return fmt.Errorf("pool default not listed")
		})
		shot(t, "pools")
	})

	require.True(t, t.Run("open a new sandbox", func(t *testing.T) {
		do(t, chromedp.Click(chromedp.CSS(`#pools-body button.new-sandbox[data-pool="default"]`)))
		waitJS(t, 30*time.Second, "the sandbox page", `location.hash.startsWith('#/sandbox/sbx-') && document.getElementById('lease-state')`)
		sbxID = strings.Split(strings.TrimPrefix(text(t, `location.hash`), "#/sandbox/"), "/")[0]
		sbx, err := api.GetSandbox(context.Background(), sbxID)
		require.NoError(t, err)
		assert.Equal(t, client.StateActive, sbx.State)
		assert.Equal(t, "console", sbx.Labels["via"])
		waitJS(t, 10*time.Second, "the lease's state", `document.getElementById('lease-state').textContent === 'active'`)
		assert.Contains(t, text(t, `document.getElementById('lease-expiry').textContent`), "left")
	}))

	t.Run("terminal", func(t *testing.T) {
		require.NotEmpty(t, sbxID)
		waitJS(t, 20*time.Second, "the terminal to connect", `document.getElementById('terminal-state').textContent.startsWith('connected')`)
		typeInTerminal(t, "echo quarry-$((6*7)) && cd /tmp && pwd")
		waitJS(t, 10*time.Second, "the command's output in the terminal", terminalHas("quarry-42"))
		waitJS(t, 10*time.Second, "the shell's new cwd", terminalHas("/tmp"))
		shot(t, "terminal")

		// Resize: a smaller window refits the terminal, and the shell sees
		// the new size (stty asks the PTY).
		do(t, chromedp.EmulateViewport(900, 700))
		typeInTerminal(t, "echo size-$(stty size | tr ' ' x)")
		waitJS(t, 10*time.Second, "the new size in the shell", `/size-\d+x\d+/.test(document.querySelector('#terminal .xterm-rows').textContent)`)
		do(t, chromedp.EmulateViewport(shotWidth, shotHeight))
	})

	t.Run("gateway restart", func(t *testing.T) {
		require.NotEmpty(t, sbxID)
		g.stop()
		waitJS(t, 20*time.Second, "the page to notice", `document.getElementById('status').textContent.includes('unreachable')`)
		waitJS(t, 20*time.Second, "the terminal to retry", `document.getElementById('terminal-state').textContent.includes('retrying')`)
		g.start()
		waitJS(t, 30*time.Second, "the terminal to reconnect", `document.getElementById('terminal-state').textContent.startsWith('connected')`)
		waitJS(t, 10*time.Second, "the status to clear", `document.getElementById('status').textContent === ''`)
		// The same PTY: the replay ring repainted the screen, and the shell
		// kept its state.
		waitJS(t, 10*time.Second, "the replayed screen", terminalHas("quarry-42"))
		typeInTerminal(t, "echo again-$((2+3)) in $(pwd)")
		waitJS(t, 10*time.Second, "the output after the restart", terminalHas("again-5 in /tmp"))
	})

	t.Run("files: upload, download, view", func(t *testing.T) {
		require.NotEmpty(t, sbxID)
		payload := make([]byte, 300<<10)
		_, err := rand.Read(payload)
		require.NoError(t, err)
		for i := range 256 {
			payload[i] = byte(i) // every byte value
		}
		src := filepath.Join(t.TempDir(), "upload.bin")
		require.NoError(t, os.WriteFile(src, payload, 0o644))
		_, err = api.WriteFile(context.Background(), sbxID, "notes.txt", 0o644, strings.NewReader("console view check\nline two\n"))
		require.NoError(t, err)

		do(t, chromedp.Click(chromedp.CSS(`a[data-tab="files"]`)))
		waitJS(t, 10*time.Second, "the listing", `document.querySelector('#files-body tr[data-file="notes.txt"]')`)
		do(t, chromedp.SetUploadFiles(chromedp.ID("upload-file"), []string{src}), chromedp.Click(chromedp.ID("upload-submit")))
		waitJS(t, 20*time.Second, "the upload", `document.getElementById('upload-state').textContent.includes('uploaded')`)
		waitJS(t, 10*time.Second, "the uploaded file listed", `document.querySelector('#files-body tr[data-file="upload.bin"]')`)
		got := sandboxFile(t, api, sbxID, "upload.bin")
		assert.True(t, bytes.Equal(payload, got), "the sandbox holds the uploaded bytes (%d of %d)", len(got), len(payload))

		do(t, chromedp.Click(chromedp.CSS(`#files-body tr[data-file="upload.bin"] button.download`)))
		saved := filepath.Join(downloads, "upload.bin")
		eventually(t, 20*time.Second, "the download", func() error {
			b, err := os.ReadFile(saved)
			if err != nil {
				return err
			}
			if len(b) != len(payload) {
				return fmt.Errorf("%d of %d bytes", len(b), len(payload))
			}
			return nil
		})
		b, err := os.ReadFile(saved)
		require.NoError(t, err)
		assert.True(t, bytes.Equal(payload, b), "the downloaded bytes are the uploaded ones")

		// View of a binary file says so, shows none of its bytes, and offers the download.
		require.NoError(t, os.Remove(saved))
		do(t, chromedp.Click(chromedp.CSS(`#files-body tr[data-file="upload.bin"] button.view`)))
		waitJS(t, 10*time.Second, "the binary notice", `(() => { const b = document.getElementById('file-binary');
			return b && !b.hidden && b.textContent.includes('upload.bin is binary') && b.textContent.includes('300.0 KiB'); })()`)
		assert.Equal(t, "true", text(t, `String(document.getElementById('file-view').hidden)`), "no bytes shown as text")
		do(t, chromedp.Click(chromedp.ID("file-binary-download")))
		eventually(t, 20*time.Second, "the download from the notice", func() error {
			b, err := os.ReadFile(saved)
			if err != nil {
				return err
			}
			if !bytes.Equal(payload, b) {
				return fmt.Errorf("%d of %d bytes, or other bytes", len(b), len(payload))
			}
			return nil
		})

		do(t, chromedp.Click(chromedp.CSS(`#files-body tr[data-file="notes.txt"] button.view`)))
		waitJS(t, 10*time.Second, "the viewer", `document.getElementById('file-view').textContent.includes('console view check')`)
		assert.Equal(t, "true", text(t, `String(document.getElementById('file-binary').hidden)`), "a text file: no binary notice")
		shot(t, "files")
	})

	t.Run("processes: start and follow", func(t *testing.T) {
		require.NotEmpty(t, sbxID)
		do(t, chromedp.Click(chromedp.CSS(`a[data-tab="processes"]`)), chromedp.WaitVisible(chromedp.ID("process-command")),
			chromedp.SendKeys(chromedp.ID("process-command"), "for i in 1 2 3; do echo tick-$i; sleep 0.3; done; echo done-$((40+2))"),
			chromedp.Click(chromedp.ID("process-submit")))
		waitJS(t, 10*time.Second, "followed output", `document.getElementById('process-output').textContent.includes('tick-1')`)
		waitJS(t, 15*time.Second, "the exit", `document.getElementById('process-following').textContent.includes('exited with code 0')`)
		out := text(t, `document.getElementById('process-output').textContent`)
		assert.Equal(t, "tick-1\ntick-2\ntick-3\ndone-42\n", out)
		waitJS(t, 10*time.Second, "the process listed as exited", `[...document.querySelectorAll('#processes-body tr[data-process]')].some(r => r.textContent.includes('exited'))`)
		shot(t, "processes")
	})

	t.Run("checkpoints: create and restore", func(t *testing.T) {
		require.NotEmpty(t, sbxID)
		do(t, chromedp.Click(chromedp.CSS(`a[data-tab="checkpoints"]`)), chromedp.WaitVisible(chromedp.ID("checkpoint-paths")),
			chromedp.Click(chromedp.ID("checkpoint-submit")))
		waitJS(t, 30*time.Second, "the checkpoint", `document.getElementById('checkpoints-ok').textContent.startsWith('created ckp-')`)
		waitJS(t, 10*time.Second, "the checkpoint listed", `document.querySelector('#checkpoints-body tr[data-checkpoint]')`)
		// Change a file, restore, and the file is back.
		_, err := api.WriteFile(context.Background(), sbxID, "notes.txt", 0o644, strings.NewReader("changed"))
		require.NoError(t, err)
		do(t, chromedp.Click(chromedp.CSS(`#checkpoints-body tr[data-checkpoint] button.restore`)))
		waitJS(t, 30*time.Second, "the restore", `document.getElementById('checkpoints-ok').textContent.startsWith('restored ckp-')`)
		got := sandboxFile(t, api, sbxID, "notes.txt")
		assert.Equal(t, "console view check\nline two\n", string(got))
		shot(t, "checkpoints")
	})

	t.Run("model transcript", func(t *testing.T) {
		require.NotEmpty(t, sbxID)
		do(t, chromedp.Click(chromedp.CSS(`a[data-tab="model"]`)))
		waitJS(t, 10*time.Second, "the empty transcript", `document.getElementById('transcript-empty')`)
		// A model call from inside the sandbox, answered by a trainer.
		_, err := api.StartProcess(context.Background(), sbxID, agentapi.ProcessStartRequest{Command: `curl -sS -H "Authorization: Bearer $OPENAI_API_KEY" ` +
			`-H 'Content-Type: application/json' -d '{"model": "policy", "messages": [{"role": "user", "content": "hello console"}]}' ` +
			`"$OPENAI_BASE_URL/chat/completions"`})
		require.NoError(t, err)
		tr := &modeltest.Trainer{URL: g.url(), Key: g.key}
		var claimed []modeltest.ClaimedRequest
		eventually(t, 30*time.Second, "the sandbox's model call", func() error {
			reqs, err := tr.Claim(2*time.Second, 1, "")
			if err != nil {
				return err
			}
			if len(reqs) == 0 {
				return fmt.Errorf("no request yet")
			}
			claimed = reqs
			return nil
		})
		code, b, err := tr.Respond(claimed[0].ID, 0, modeltest.ChatCompletion("chatcmpl-console", "policy", "answer from the trainer"))
		require.NoError(t, err)
		require.Equal(t, 200, code, "%s", b)
		waitJS(t, 15*time.Second, "the exchange on the page", `(() => { const d = document.querySelector('#transcript details');
			return d && d.textContent.includes('hello console') && d.textContent.includes('answer from the trainer') && d.textContent.includes('answered'); })()`)
		do(t, chromedp.Click(chromedp.CSS(`#transcript details summary`)))
		shot(t, "model")
	})

	t.Run("sandboxes page filters", func(t *testing.T) {
		require.NotEmpty(t, sbxID)
		do(t, chromedp.Navigate(base+"#/sandboxes?pool=default&state=active&label=via%3Dconsole"))
		waitJS(t, 10*time.Second, "our sandbox listed", fmt.Sprintf(`document.querySelector('#sandboxes-body tr[data-sandbox=%q]')`, sbxID))
		assert.Equal(t, "1", text(t, `String(document.querySelectorAll('#sandboxes-body tr[data-sandbox]').length)`), "only the labelled one")
		shot(t, "sandboxes")
		do(t, chromedp.Navigate(base+"#/sandboxes?label=via%3Dnobody"))
		waitJS(t, 10*time.Second, "an empty list", `document.getElementById('sandboxes-body').textContent.includes('No sandboxes match')`)
	})

	t.Run("heartbeat and release", func(t *testing.T) {
		require.NotEmpty(t, sbxID)
		do(t, chromedp.Navigate(base+"#/sandbox/"+sbxID+"/terminal"))
		waitJS(t, 10*time.Second, "the lease", `document.getElementById('lease-state') && document.getElementById('lease-state').textContent === 'active'`)
		before, err := api.GetSandbox(context.Background(), sbxID)
		require.NoError(t, err)
		time.Sleep(1100 * time.Millisecond) // the new expiry is later by at least this
		do(t, chromedp.Click(chromedp.ID("heartbeat")))
		eventually(t, 10*time.Second, "the heartbeat", func() error {
			s, err := api.GetSandbox(context.Background(), sbxID)
			if err != nil {
				return err
			}
			if !s.ExpiresAt.After(before.ExpiresAt) {
				return fmt.Errorf("expires_at %s not after %s", s.ExpiresAt, before.ExpiresAt)
			}
			return nil
		})
		waitJS(t, 20*time.Second, "the terminal to connect", `document.getElementById('terminal-state').textContent.startsWith('connected')`)
		// The shell's exit code reaches the page; New terminal starts another.
		typeInTerminal(t, "exit 3")
		waitJS(t, 10*time.Second, "the exit", `document.getElementById('terminal-state').textContent === 'exited with code 3'`)
		do(t, chromedp.Click(chromedp.ID("terminal-new")))
		waitJS(t, 20*time.Second, "a new terminal", `document.getElementById('terminal-state').textContent.startsWith('connected')`)
		typeInTerminal(t, "echo fresh-$((1+1))")
		waitJS(t, 10*time.Second, "the new shell's output", terminalHas("fresh-2"))
		do(t, chromedp.Click(chromedp.ID("release")))
		waitJS(t, 10*time.Second, "released", `document.getElementById('lease-state').textContent === 'released'`)
		assert.Equal(t, "true true", text(t, `['heartbeat', 'release'].map((i) => document.getElementById(i).hidden).join(' ')`),
			"an ended lease: no Heartbeat or Release")
		s, err := api.GetSandbox(context.Background(), sbxID)
		require.NoError(t, err)
		assert.Equal(t, client.StateReleased, s.State)
		// The terminal's socket closes with 4410 and the page says so.
		waitJS(t, 20*time.Second, "the terminal to say the lease ended", `document.getElementById('terminal-state').textContent.includes('lease has ended')`)
		shot(t, "released")
	})

	// The page of a sandbox that does not exist says so, offers no action
	// and asks nothing again: neither the lease's poll nor the terminal
	// retries the 404.
	t.Run("unknown sandbox", func(t *testing.T) {
		do(t, chromedp.Navigate(base+"#/pools"), chromedp.Evaluate[chromedp.Void](`performance.setResourceTimingBufferSize(100000); performance.clearResourceTimings()`))
		do(t, chromedp.Navigate(base+"#/sandbox/"+missingSandbox+"/terminal"))
		waitJS(t, 10*time.Second, "the page to say so", `(document.getElementById('lease-missing') || {textContent: ''}).textContent.includes('does not exist')`)
		assert.Equal(t, "true true true", text(t, `['heartbeat', 'release', 'sandbox-tabs'].map((i) => document.getElementById(i).hidden).join(' ')`),
			"no Heartbeat, Release or tabs")
		calls := fmt.Sprintf(`String(performance.getEntriesByType('resource').filter((e) => e.name.includes('/v1/sandboxes/%s')).length)`, missingSandbox)
		asked := text(t, calls)
		require.NotEqual(t, "0", asked, "the page's calls are counted")
		// Longer than the lease's poll (3 s) and the terminal's first retries (0.5, 1, 2 s).
		for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
			require.Equal(t, asked, text(t, calls), "a call after the 404")
		}
		assert.NotContains(t, text(t, `document.body.innerText`), "retrying")
		shot(t, "unknown")
	})

	t.Run("sign out", func(t *testing.T) {
		do(t, chromedp.Click(chromedp.ID("signout")))
		waitJS(t, 10*time.Second, "the sign-in form", `document.getElementById('apikey')`)
		assert.Equal(t, "0", text(t, `String(sessionStorage.length)`), "sign-out clears the key")
	})

	errs, all := blog.snapshot()
	assert.Empty(t, errs, "the page's console had errors:\n%s", strings.Join(all, "\n"))
	assert.Zero(t, blog.violations.Load(), "CSP violations:\n%s", strings.Join(all, "\n"))
	if t.Failed() {
		t.Logf("the page's console:\n%s", strings.Join(all, "\n"))
	}
}

// keystroke is one key press as a keyboard makes it: a keyDown that
// carries the text (the browser derives keypress and input from it) and a
// keyUp. chromedp's KeyEvent sends a separate char event after a keyDown
// that carries the key, which xterm.js takes as two presses (it handles
// the keydown and the keypress); Puppeteer and Playwright type as here.
func keystroke(r rune) []input.DispatchKeyEventParams {
	down := input.DispatchKeyEventParams{Type: input.DispatchKeyEventTypeKeyDown, Key: string(r), Text: string(r), UnmodifiedText: string(r)}
	if r == '\r' {
		down.Key, down.Code, down.WindowsVirtualKeyCode, down.NativeVirtualKeyCode = "Enter", "Enter", 13, 13
	}
	up := down
	up.Type, up.Text, up.UnmodifiedText = input.DispatchKeyEventTypeKeyUp, "", ""
	return []input.DispatchKeyEventParams{down, up}
}

// sandboxFile reads a sandbox's file whole through the API.
func sandboxFile(t *testing.T, c *client.Client, id, path string) []byte {
	t.Helper()
	rc, err := c.ReadFile(context.Background(), id, path, 0, 0)
	require.NoError(t, err)
	defer rc.Close()
	b, err := io.ReadAll(rc)
	require.NoError(t, err)
	return b
}
