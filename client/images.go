package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/quarryhq/quarry/api"
)

// Images on demand: the wire types of the images API, declared in api.
type (
	// PrefetchRequest announces images the next creates will ask for.
	PrefetchRequest = api.PrefetchRequest
	// PrefetchedImage is one image of a prefetch's answer.
	PrefetchedImage = api.PrefetchedImage
	// Image is one image of an on-demand pool (GET /v1/images).
	Image = api.Image
	// BuildEvent is one line of a build's answer.
	BuildEvent = api.BuildEvent
	// Class is one pool class of on-demand pools.
	Class = api.Class
)

// Prefetch asks the gateway to start preparing images the next creates will
// ask for (POST /v1/images/prefetch) and returns each image's pool and
// state, in order; a refused image carries its error (PrefetchedImage.Error)
// and does not fail the call.
func (c *Client) Prefetch(ctx context.Context, req PrefetchRequest) ([]PrefetchedImage, error) {
	var out api.PrefetchResponse
	err := c.do(ctx, call{method: http.MethodPost, route: route{path: "/v1/images/prefetch"}, in: req}, &out)
	return out.Images, err
}

// ImagesPage returns one page of the on-demand pools' images after cursor
// ("" for the first), at most limit (0: the gateway's default), and the
// cursor of the next page ("" after the last) (GET /v1/images).
func (c *Client) ImagesPage(ctx context.Context, cursor string, limit int) ([]Image, string, error) {
	q := url.Values{}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out api.ImageList
	err := c.do(ctx, call{method: http.MethodGet, route: route{path: "/v1/images"}, query: q}, &out)
	return out.Images, out.Next, err
}

// ImagesOf returns the images of the on-demand pools named, and the images
// named (normalized references, as PrefetchedImage.Ref) while no pool holds
// them: their first preparation or its failure (GET
// /v1/images?pool=&image=; at most 100 of each).
func (c *Client) ImagesOf(ctx context.Context, pools, refs []string) ([]Image, error) {
	q := url.Values{"pool": pools, "image": refs}
	var out api.ImageList
	err := c.do(ctx, call{method: http.MethodGet, route: route{path: "/v1/images"}, query: q}, &out)
	return out.Images, err
}

// maxImagePages bounds Images' walk (1,000 images a page).
const maxImagePages = 1000

// Images returns every image of the on-demand pools, walking the pages.
func (c *Client) Images(ctx context.Context) ([]Image, error) {
	var all []Image
	cursor := ""
	for range maxImagePages {
		page, next, err := c.ImagesPage(ctx, cursor, 1000)
		if err != nil {
			return all, err
		}
		all = append(all, page...)
		if next == "" {
			return all, nil
		}
		cursor = next
	}
	return all, fmt.Errorf("list images: more than %d pages", maxImagePages)
}

// BuildImageRequest is a build (BuildImage): Context is a tar stream of the
// build context with the Dockerfile (at Dockerfile, default "Dockerfile").
type BuildImageRequest struct {
	Name       string // NAME[:TAG]
	Dockerfile string
	Class      string
	Context    io.Reader
}

// BuildImage builds an image on the gateway's engine (POST
// /v1/images/build), calling onLog (may be nil) with each line of the
// build's log as it comes, and returns the image built: a reference that a
// create may name at once. A build that ran and failed is an *Error (422,
// code build_failed) with the step's message.
func (c *Client) BuildImage(ctx context.Context, req BuildImageRequest, onLog func(line string)) (BuildEvent, error) {
	q := url.Values{"name": {req.Name}}
	if req.Dockerfile != "" {
		q.Set("dockerfile", req.Dockerfile)
	}
	if req.Class != "" {
		q.Set("class", req.Class)
	}
	resp, err := c.send(ctx, call{method: http.MethodPost, route: route{path: "/v1/images/build"}, query: q, body: req.Context,
		accept: "application/x-ndjson"})
	if err != nil {
		return BuildEvent{}, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev BuildEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return BuildEvent{}, fmt.Errorf("decode build event: %w", err)
		}
		switch {
		case ev.Error != nil:
			return ev, &Error{Status: ev.Error.Status, Code: ev.Error.Code, Message: ev.Error.Message}
		case ev.Image != "":
			return ev, nil
		case onLog != nil && ev.Log != "": // {} is a keep-alive
			onLog(ev.Log)
		}
	}
	if err := sc.Err(); err != nil {
		return BuildEvent{}, fmt.Errorf("read the build's answer: %w", err)
	}
	return BuildEvent{}, fmt.Errorf("the build's answer ended without its result")
}

// Whoami returns the API key's owner id (GET /v1/whoami), which the
// operator's QUARRY_IMAGE_ALLOW and QUARRY_IMAGE_BUILD_KEYS name.
func (c *Client) Whoami(ctx context.Context) (string, error) {
	var out struct {
		Owner string `json:"owner"`
	}
	err := c.do(ctx, call{method: http.MethodGet, route: route{path: "/v1/whoami"}}, &out)
	return out.Owner, err
}

// Classes returns the pool classes of on-demand pools (GET /v1/pools).
func (c *Client) Classes(ctx context.Context) ([]Class, error) {
	var out api.PoolList
	err := c.do(ctx, call{method: http.MethodGet, route: route{path: "/v1/pools"}}, &out)
	return out.Classes, err
}
