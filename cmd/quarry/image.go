package main

import (
	"archive/tar"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/client"
)

// imageCommands are the subcommands of `quarry image`.
func imageCommands() []command {
	return []command{
		{"prefetch", "quarry image prefetch [--warm N] [--class C] [--cpu N] [--memory SIZE] [--disk SIZE] [--no-wait] [--wait D] IMAGE…",
			"start preparing images the next sandboxes will ask for (pulls; on ECS task definitions) and show their progress until each is ready or failed", runPrefetch},
		{"ls", "quarry image ls [--json]", "list the images of on-demand pools: state, size, last use", runImages},
		{"build", "quarry image build -t NAME[:TAG] [-f Dockerfile] [--class C] DIR",
			"build an image from DIR on the gateway's engine (when the operator allows this key), streaming the build's log; prints the image to create sandboxes from", runBuild},
	}
}

// mibFlag is a size flag in MiB: a number, or a string with a unit ("2Gi").
type mibFlag struct {
	name string
	v    *api.MiB
}

func (s mibFlag) String() string {
	if s.v == nil {
		return ""
	}
	return fmt.Sprint(int(*s.v))
}

func (s mibFlag) Set(v string) error {
	n, err := api.ParseMiB(s.name, v)
	if err != nil {
		return err
	}
	*s.v = api.MiB(n)
	return nil
}

// resourceFlags adds --class, --cpu, --memory and --disk to fs.
func resourceFlags(fs *flag.FlagSet) (class *string, cpu *float64, memory, disk *api.MiB) {
	class = fs.String("class", "", "pool class (default: the first class that serves the image)")
	cpu = fs.Float64("cpu", 0, "vCPUs (0: the class's)")
	memory, disk = new(api.MiB), new(api.MiB)
	fs.Var(mibFlag{"memory", memory}, "memory", "memory, MiB or e.g. 2Gi (0: the class's)")
	fs.Var(mibFlag{"disk", disk}, "disk", "work directory size, MiB or e.g. 10Gi (0: the class's)")
	return class, cpu, memory, disk
}

// prefetchPoll is how often `quarry image prefetch` reads the images'
// progress.
const prefetchPoll = 500 * time.Millisecond

func runPrefetch(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("image prefetch")
	warm := fs.Int("warm", 0, "ready sandboxes to keep for each image, for the class's warm window")
	class, cpu, memory, disk := resourceFlags(fs)
	noWait := fs.Bool("no-wait", false, "print the images' states and return at once")
	wait := fs.Duration("wait", 30*time.Minute, "how long to show the progress before returning (the preparations go on)")
	images, cl, err := c.start(fs, args, 1, -1)
	if err != nil {
		return err
	}
	res, err := cl.Prefetch(ctx, client.PrefetchRequest{Images: images, Class: *class, CPU: *cpu, Memory: *memory, Disk: *disk, Warm: *warm})
	if err != nil {
		return fmt.Errorf("prefetch: %w", err)
	}
	var refused []error
	var pending []client.PrefetchedImage
	for _, r := range res {
		if r.Error != nil {
			refused = append(refused, fmt.Errorf("%s: %s (%d %s)", r.Image, r.Error.Message, r.Error.Status, r.Error.Code))
			continue
		}
		pending = append(pending, r)
	}
	for _, err := range refused {
		fmt.Fprintf(c.stderr, "refused %s\n", err)
	}
	if *noWait || len(pending) == 0 {
		for _, r := range pending {
			fmt.Fprintf(c.stdout, "%s\t%s\t%s\n", r.Image, r.State, r.Pool)
		}
		return errors.Join(refused...)
	}
	p := &progress{w: c.stdout, tty: isTerminal(c.stdout), images: pending, last: map[string]string{}}
	err = p.follow(ctx, cl, *wait)
	return errors.Join(append(refused, err)...)
}

// progress shows the preparation of prefetched images: on a terminal a bar
// per image redrawn in place, otherwise a line per change of state.
type progress struct {
	w      io.Writer
	tty    bool
	images []client.PrefetchedImage
	last   map[string]string // the state last printed per image (not on a terminal)
	drawn  int               // lines drawn at the last redraw (terminal)
}

// follow polls GET /v1/images until every image is ready or failed, or
// wait has passed; a failed image is an error.
func (p *progress) follow(ctx context.Context, cl *client.Client, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	t := time.NewTicker(prefetchPoll)
	defer t.Stop()
	var pools, refs []string
	for _, r := range p.images {
		pools, refs = append(pools, r.Pool), append(refs, r.Ref)
	}
	for {
		var all []client.Image
		for i := 0; i < len(pools); i += 100 { // 100 of each a call
			page, err := cl.ImagesOf(ctx, pools[i:min(i+100, len(pools))], refs[i:min(i+100, len(refs))])
			if err != nil {
				return fmt.Errorf("read the images' progress: %w", err)
			}
			all = append(all, page...)
		}
		done, failed := p.draw(all)
		if done {
			return errors.Join(failed...)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("images still preparing after --wait %s (they go on; quarry image ls shows them)", wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// draw shows each image's state and reports whether all are done, with
// the failures.
func (p *progress) draw(all []client.Image) (bool, []error) {
	byPool, byRef := map[string]client.Image{}, map[string]client.Image{}
	for _, im := range all {
		if im.Pool != "" {
			byPool[im.Pool] = im
		}
		byRef[im.Image] = im
	}
	done := true
	var failed []error
	lines, states := make([]string, len(p.images)), make([]string, len(p.images))
	for i, r := range p.images {
		im, ok := byPool[r.Pool]
		if !ok || im.State == api.ImageReady && r.State != api.PrefetchReady && im.PoolState == "" {
			if loose, ok2 := byRef[r.Ref]; ok2 {
				im, ok = loose, true
			}
		}
		state := "queued"
		switch {
		case !ok:
		case im.State == api.ImageFailed:
			state = "failed: " + im.Reason
			failed = append(failed, fmt.Errorf("%s: %s", r.Image, im.Reason))
		case im.State == api.ImagePulling:
			state = "pulling"
		case im.Pool != "" && im.State == api.ImageReady:
			state = "ready"
		}
		if state == "queued" || state == "pulling" {
			done = false
		}
		states[i] = state
		lines[i] = fmt.Sprintf("%-40s %s %s", r.Image, bar(im.BytesDone, im.BytesTotal, state == "ready"), state)
		if state == "pulling" && im.BytesTotal > 0 {
			lines[i] += fmt.Sprintf(" %s/%s", mib(im.BytesDone), mib(im.BytesTotal))
		}
	}
	if p.tty {
		if p.drawn > 0 {
			fmt.Fprintf(p.w, "\x1b[%dA", p.drawn) // back to the first line
		}
		for _, l := range lines {
			fmt.Fprintf(p.w, "\r\x1b[2K%s\n", l)
		}
		p.drawn = len(lines)
		return done, failed
	}
	for i, r := range p.images { // a line per change of state
		if p.last[r.Image] != states[i] {
			p.last[r.Image] = states[i]
			fmt.Fprintln(p.w, lines[i])
		}
	}
	return done, failed
}

// bar is a 20-character progress bar: full when done, by bytes when known.
func bar(done, total int64, full bool) string {
	const width = 20
	n := 0
	switch {
	case full:
		n = width
	case total > 0:
		n = int(min(done, total) * width / total)
	}
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", width-n) + "]"
}

// mib formats a byte count in MiB.
func mib(n int64) string { return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20)) }

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func runImages(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("image ls")
	asJSON := fs.Bool("json", false, "print the images as JSON")
	_, cl, err := c.start(fs, args, 0, 0)
	if err != nil {
		return err
	}
	all, err := cl.Images(ctx)
	if err != nil {
		return fmt.Errorf("list images: %w", err)
	}
	if *asJSON {
		if all == nil {
			all = []client.Image{}
		}
		return printJSON(c.stdout, all)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "IMAGE\tCLASS\tPOOL\tSTATE\tSIZE\tLAST USED\tACQUIRES\tWARM")
	for _, im := range all {
		state := im.State
		switch {
		case im.State == api.ImagePulling && im.BytesTotal > 0:
			state += fmt.Sprintf(" %d%%", im.BytesDone*100/im.BytesTotal)
		case im.State == api.ImageFailed:
			state += ": " + im.Reason
		case im.PoolState == "ended":
			state += " (pool ended)"
		}
		size := "-"
		if im.SizeBytes > 0 {
			size = mib(im.SizeBytes)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", im.Image, orDash(im.Class), orDash(im.Pool), state, size,
			formatTime(im.LastUsed), im.Acquires, im.Warm)
	}
	return tw.Flush()
}

func runBuild(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("image build")
	name := fs.String("t", "", "NAME[:TAG] of the image (required)")
	dockerfile := fs.String("f", "", "the Dockerfile's path inside DIR (default Dockerfile)")
	class := fs.String("class", "", "the class whose provider builds (default: the first that builds)")
	pos, cl, err := c.start(fs, args, 1, 1)
	if err != nil {
		return err
	}
	if *name == "" {
		return errors.New("image build: -t NAME[:TAG] is required")
	}
	dir := pos[0]
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return fmt.Errorf("image build: %s is not a directory", dir)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(tarDir(pw, dir)) }()
	ev, err := cl.BuildImage(ctx, client.BuildImageRequest{Name: *name, Dockerfile: *dockerfile, Class: *class, Context: pr},
		func(line string) { fmt.Fprintln(c.stderr, line) })
	pr.CloseWithError(errors.New("the build ended"))
	if err != nil {
		return fmt.Errorf("image build: %w", err)
	}
	_, err = fmt.Fprintln(c.stdout, ev.Image)
	return err
}

// tarDir writes the tree at dir as a tar stream: regular files,
// directories and symlinks, with their modes; paths relative to dir.
func tarDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		} else if !info.Mode().IsRegular() && !info.IsDir() {
			return nil // devices, sockets, fifos: not part of a context
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return fmt.Errorf("pack %s: %w", dir, err)
	}
	return tw.Close()
}
