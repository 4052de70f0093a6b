package main

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// runURL is `quarry sandbox url [--ttl D] [--json] ID PORT`: it prints a
// preview URL of the port (and on stderr when it expires).
func runURL(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("sandbox url")
	ttl := fs.Duration("ttl", 0, "how long the URL works (default: the gateway's, 1h; at most 24h); it ends with the lease anyway")
	asJSON := fs.Bool("json", false, "print the URL and its expiry as JSON")
	pos, cl, err := c.start(fs, args, 2, 2)
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(pos[1])
	if err != nil {
		return fmt.Errorf("sandbox url: PORT must be a number from 1 to 65535, got %q", pos[1])
	}
	if *ttl < 0 {
		return fmt.Errorf("sandbox url: --ttl must not be negative, got %s", *ttl)
	}
	u, err := cl.PreviewURL(ctx, pos[0], port, *ttl)
	if err != nil {
		return fmt.Errorf("preview URL of %s port %d: %w", pos[0], port, err)
	}
	if *asJSON {
		return printJSON(c.stdout, u)
	}
	fmt.Fprintln(c.stdout, u.URL)
	fmt.Fprintf(c.stderr, "expires %s (or when the lease ends)\n", u.ExpiresAt.Local().Format(time.RFC3339))
	return nil
}
