package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

// keyCommands are the commands of `quarry key`: making API keys for
// QUARRY_API_KEYS, without a gateway.
func keyCommands() []command {
	return []command{
		{"new", "quarry key new [--e2b]", "print a new random API key for QUARRY_API_KEYS: qk_ and 48 hex digits; with --e2b, e2b_ and 40, the shape E2B's SDK checks its E2B_API_KEY against", runKeyNew},
	}
}

// newKey returns a new random API key: prefix and the hex of n random
// bytes.
func newKey(prefix string, n int) string {
	raw := make([]byte, n)
	_, _ = rand.Read(raw) // crypto/rand.Read never fails: it panics on a broken source
	return prefix + hex.EncodeToString(raw)
}

func runKeyNew(_ context.Context, c *cli, args []string) error {
	fs := c.flags("key new")
	e2b := fs.Bool("e2b", false, "a key of E2B's shape (^e2b_[0-9a-f]+$), which E2B's SDK accepts without E2B_VALIDATE_API_KEY=false")
	if _, err := c.positional(fs, args, 0, 0); err != nil {
		return err
	}
	key := newKey("qk_", 24)
	if *e2b {
		key = newKey("e2b_", 20)
	}
	_, err := fmt.Fprintln(c.stdout, key)
	return err
}
