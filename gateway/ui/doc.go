// Package ui holds the web console's static files (index.html, app.js,
// style.css and the vendored xterm.js under vendor/), embedded in the
// gateway binary. The gateway serves them at /ui (gateway/console.go) with
// a strict Content-Security-Policy; the page is a client of the public API
// and nothing else (docs/CONSOLE.md).
//
// It imports only the standard library and must not import any Quarry
// package: it is data.
package ui
