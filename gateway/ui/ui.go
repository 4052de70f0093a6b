package ui

import (
	"embed"
	"io/fs"
)

// files is the console, embedded at build time (read-only).
//
//go:embed index.html app.js style.css vendor/xterm
var files embed.FS

// Files returns the console's files, rooted at the console: "index.html",
// "app.js", "vendor/xterm/xterm.mjs", …. The file system is read-only and
// safe for concurrent use.
func Files() fs.FS { return files }
