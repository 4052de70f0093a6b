package main

import (
	"fmt"

	"github.com/quarryhq/quarry/rockcompat"
	"github.com/quarryhq/quarry/warmpool"
)

// parseRockImages reads QUARRY_ROCK_IMAGES (image=pool pairs for ROCK's
// routes, docs/ROCK.md); every pool it names must be one of pools.
func parseRockImages(s string, pools []warmpool.PoolConfig) (map[string]string, error) {
	images, err := rockcompat.ParseImages(s)
	if err != nil {
		return nil, fmt.Errorf("QUARRY_ROCK_IMAGES: %w", err)
	}
	known := poolNames(pools)
	for image, pool := range images {
		if !known[pool] {
			return nil, fmt.Errorf("QUARRY_ROCK_IMAGES: image %q maps to pool %q, which is not in the pools file", image, pool)
		}
	}
	return images, nil
}

// poolNames returns the set of pools' names.
func poolNames(pools []warmpool.PoolConfig) map[string]bool {
	known := make(map[string]bool, len(pools))
	for _, p := range pools {
		known[p.Name] = true
	}
	return known
}
