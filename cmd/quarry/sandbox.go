package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/quarryhq/quarry/api"
	"github.com/quarryhq/quarry/client"
)

// sandboxCommands are the subcommands of `quarry sandbox`.
func sandboxCommands() []command {
	return []command{
		{"create", "quarry sandbox create [--pool default | --image IMAGE [--class C] [--cpu N] [--memory SIZE] [--disk SIZE]] [--lease-seconds N] [--env K=V]… [--label K=V]… [--from-checkpoint CKP] [--idempotency-key K] [--json]",
			"lease a sandbox (of a pool, or of any image the operator allows) and print its id", runCreate},
		{"ls", "quarry sandbox ls [--all | --state S] [--pool P] [--label K=V]… [--json]", "list your active sandboxes (--all: ended ones too)", runList},
		{"get", "quarry sandbox get [--json] ID", "show one sandbox", runGet},
		{"heartbeat", "quarry sandbox heartbeat [--json] ID", "renew a sandbox's lease", runHeartbeat},
		{"exec", "quarry sandbox exec [-i] [--timeout D] [--max-output SIZE] [--env K=V]… [--cwd DIR] ID -- CMD ARGS…\n       quarry sandbox exec [flags] ID 'SHELL STRING'",
			"run a command, streaming its output byte for byte; exits with its status (" + strconv.Itoa(exitOutputCut) + " when it succeeded but its output went over --max-output)", runExec},
		{"shell", "quarry sandbox shell [--timeout D] [--env K=V]… [--cwd DIR] ID", "an interactive shell: a real terminal when stdin is one (raw mode, resizes, the exit code), else a line session (Ctrl-D ends it)", runShellCommand},
		{"cp", "quarry sandbox cp LOCAL ID:REMOTE\n       quarry sandbox cp ID:REMOTE LOCAL\n       (LOCAL - is standard input or output: a file's bytes, a directory as a tar)", "copy a file or a directory in or out", runCopy},
		{"restore", "quarry sandbox restore [--json] ID CKP", "roll a sandbox's paths back to a checkpoint, in place (processes keep running)", runRestore},
		{"fork", "quarry sandbox fork [-n N] [--lease-seconds N] [--path P]… [--exclude GLOB]… [--label K=V]… [--keep-checkpoint] [--json] ID",
			"take a checkpoint and make N sandboxes from it; prints one id per fork (failures on stderr)", runFork},
		{"kill-all", "quarry sandbox kill-all [--json] ID", "kill every process in a sandbox but its agent (sessions end); the lease stays", runKillAll},
		{"rm", "quarry sandbox rm ID…", "release sandboxes", runRemove},
		{"url", "quarry sandbox url [--ttl D] [--json] ID PORT", "print a signed preview URL of a port in the sandbox (works without the API key until it expires or the lease ends)", runURL},
	}
}

// poolsCommand is `quarry pools`.
func poolsCommand() command {
	return command{"pools", "quarry pools [--json]", "list the pools and their counts", runPools}
}

// positional parses the flags and arguments of the command fs is named
// for, which takes between min and max arguments (max < 0: any number).
func (c *cli) positional(fs *flag.FlagSet, args []string, min, max int) ([]string, error) {
	pos, rest, err := c.parse(fs, args, usageOf(fs.Name()))
	if err != nil {
		return nil, err
	}
	pos = append(pos, rest...)
	switch {
	case len(pos) < min:
		return nil, fmt.Errorf("%s: missing arguments (see quarry %s -h)", fs.Name(), fs.Name())
	case max >= 0 && len(pos) > max:
		return nil, fmt.Errorf("%s: unexpected argument %q", fs.Name(), pos[max])
	}
	return pos, nil
}

// start is positional followed by a client for the gateway.
func (c *cli) start(fs *flag.FlagSet, args []string, min, max int) ([]string, *client.Client, error) {
	pos, err := c.positional(fs, args, min, max)
	if err != nil {
		return nil, nil, err
	}
	cl, err := c.client()
	return pos, cl, err
}

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printSandboxes writes a table of sandboxes.
func printSandboxes(w io.Writer, sbs []client.Sandbox) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPOOL\tSTATE\tEXPIRES\tLABELS")
	for _, sb := range sbs {
		state := sb.State
		if sb.Reason != "" {
			state += " (" + sb.Reason + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", sb.ID, sb.Pool, state, formatTime(sb.ExpiresAt), kvFlag(sb.Labels))
	}
	return tw.Flush()
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func runCreate(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("sandbox create")
	pool := fs.String("pool", "default", "pool to lease from")
	lease := fs.Int("lease-seconds", 0, "lease length in seconds (0: the pool's default)")
	env, labels := kvFlag{}, kvFlag{}
	fs.Var(env, "env", "K=V added to the environment of every command (repeatable)")
	fs.Var(labels, "label", "K=V label of the sandbox (repeatable)")
	key := fs.String("idempotency-key", "", "retrying with the same key returns the same sandbox")
	from := fs.String("from-checkpoint", "", "restore this checkpoint into the sandbox before it is handed out (--pool defaults to the checkpoint's)")
	image := fs.String("image", "", "a sandbox of this image (an on-demand pool of a class) instead of a pool")
	class, cpu, memory, disk := resourceFlags(fs)
	asJSON := fs.Bool("json", false, "print the sandbox as JSON")
	_, cl, err := c.start(fs, args, 0, 0)
	if err != nil {
		return err
	}
	if (*from != "" || *image != "") && !flagSet(fs, "pool") {
		*pool = "" // the checkpoint's pool, or the image's
	}
	sb, err := cl.CreateSandbox(ctx, client.CreateSandboxRequest{Pool: *pool, Image: *image, Class: *class, CPU: *cpu, Memory: *memory, Disk: *disk,
		LeaseSeconds: *lease, Env: env, Labels: labels, IdempotencyKey: *key, FromCheckpoint: *from})
	if err != nil {
		return fmt.Errorf("create sandbox: %w", err)
	}
	if *asJSON {
		return printJSON(c.stdout, sb)
	}
	_, err = fmt.Fprintln(c.stdout, sb.ID)
	return err
}

// flagSet reports whether flag name was given.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func runList(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("sandbox ls")
	pool := fs.String("pool", "", "only sandboxes of this pool")
	state := fs.String("state", "", "only sandboxes in this state (active, released, expired, lost; default active)")
	all := fs.Bool("all", false, "sandboxes in every state, ended ones included (kept for QUARRY_LEASE_RETENTION)")
	labels := kvFlag{}
	fs.Var(labels, "label", "only sandboxes with this K=V label (repeatable)")
	asJSON := fs.Bool("json", false, "print the sandboxes as JSON")
	_, cl, err := c.start(fs, args, 0, 0)
	if err != nil {
		return err
	}
	switch {
	case *all && *state != "":
		return errors.New("sandbox ls: --all and --state exclude each other")
	case !*all && *state == "":
		*state = api.StateActive
	}
	sbs, err := cl.ListSandboxes(ctx, client.ListSandboxesRequest{Pool: *pool, State: *state, Labels: labels})
	if err != nil {
		return fmt.Errorf("list sandboxes: %w", err)
	}
	if *asJSON {
		if sbs == nil {
			sbs = []client.Sandbox{}
		}
		return printJSON(c.stdout, sbs)
	}
	return printSandboxes(c.stdout, sbs)
}

// sandboxByID is get and heartbeat: one id in, one sandbox printed.
func sandboxByID(ctx context.Context, c *cli, args []string, name, action string,
	do func(*client.Client, context.Context, string) (client.Sandbox, error)) error {
	fs := c.flags("sandbox " + name)
	asJSON := fs.Bool("json", false, "print the sandbox as JSON")
	pos, cl, err := c.start(fs, args, 1, 1)
	if err != nil {
		return err
	}
	sb, err := do(cl, ctx, pos[0])
	if err != nil {
		return fmt.Errorf("%s %s: %w", action, pos[0], err)
	}
	if *asJSON {
		return printJSON(c.stdout, sb)
	}
	return printSandboxes(c.stdout, []client.Sandbox{sb})
}

func runGet(ctx context.Context, c *cli, args []string) error {
	return sandboxByID(ctx, c, args, "get", "get sandbox", (*client.Client).GetSandbox)
}

func runHeartbeat(ctx context.Context, c *cli, args []string) error {
	return sandboxByID(ctx, c, args, "heartbeat", "heartbeat", (*client.Client).Heartbeat)
}

func runKillAll(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("sandbox kill-all")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	pos, cl, err := c.start(fs, args, 1, 1)
	if err != nil {
		return err
	}
	res, err := cl.KillAll(ctx, pos[0])
	if err != nil {
		return fmt.Errorf("kill-all %s: %w", pos[0], err)
	}
	if *asJSON {
		return printJSON(c.stdout, res)
	}
	fmt.Fprintf(c.stdout, "%s: killed %d processes (%d threads) in %d ms", pos[0], res.Killed, res.Threads, res.DurationMS)
	if res.Left > 0 {
		fmt.Fprintf(c.stdout, "; %d still running", res.Left)
	}
	fmt.Fprintln(c.stdout)
	if res.Left > 0 {
		return fmt.Errorf("kill-all %s: %d processes outlived SIGKILL", pos[0], res.Left)
	}
	return nil
}

func runRemove(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("sandbox rm")
	pos, cl, err := c.start(fs, args, 1, -1)
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range pos {
		if _, err := cl.DeleteSandbox(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("release %s: %w", id, err))
			continue
		}
		fmt.Fprintln(c.stdout, id)
	}
	return errors.Join(errs...)
}

func runPools(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("pools")
	asJSON := fs.Bool("json", false, "print the pools as JSON")
	_, cl, err := c.start(fs, args, 0, 0)
	if err != nil {
		return err
	}
	pools, err := cl.Pools(ctx)
	if err != nil {
		return fmt.Errorf("list pools: %w", err)
	}
	sort.Slice(pools, func(i, j int) bool { return pools[i].Name < pools[j].Name })
	if *asJSON {
		if pools == nil {
			pools = []client.Pool{}
		}
		return printJSON(c.stdout, pools)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tPROVIDER\tREADY\tLAUNCHING\tLEASED\tSTOPPING\tMIN_WARM\tMAX_TOTAL")
	for _, p := range pools {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\n", p.Name, orDash(p.Provider), p.Ready, p.Launching,
			p.Leased, p.Stopping, p.MinWarm, p.MaxTotal)
	}
	return tw.Flush()
}

func orDash(s string) string {
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return s
}
