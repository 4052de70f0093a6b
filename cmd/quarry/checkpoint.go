package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/quarryhq/quarry/client"
)

// checkpointCommands are the subcommands of `quarry checkpoint`.
func checkpointCommands() []command {
	return []command{
		{"create", "quarry checkpoint create [--path P]… [--exclude GLOB]… [--label K=V]… [--json] ID",
			"take a checkpoint of a sandbox's paths (default: its work dir) and print its id", runCheckpointCreate},
		{"ls", "quarry checkpoint ls [--label K=V]… [--limit N] [--json]", "list your checkpoints, newest first", runCheckpointList},
		{"rm", "quarry checkpoint rm CKP…", "delete checkpoints", runCheckpointRemove},
	}
}

// listFlag is a repeatable string flag.
type listFlag struct{ vals *[]string }

func (f listFlag) String() string {
	if f.vals == nil {
		return ""
	}
	return strings.Join(*f.vals, ",")
}

func (f listFlag) Set(s string) error {
	*f.vals = append(*f.vals, s)
	return nil
}

func runCheckpointCreate(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("checkpoint create")
	var req client.CreateCheckpointRequest
	fs.Var(listFlag{&req.Paths}, "path", "a path to keep, absolute or relative to the work dir (repeatable; default: the work dir)")
	fs.Var(listFlag{&req.Exclude}, "exclude", "a pattern of entries to leave out, e.g. *.pyc, node_modules, build/** (repeatable)")
	labels := kvFlag{}
	fs.Var(labels, "label", "K=V label of the checkpoint (repeatable)")
	asJSON := fs.Bool("json", false, "print the checkpoint as JSON")
	pos, cl, err := c.start(fs, args, 1, 1)
	if err != nil {
		return err
	}
	if len(labels) > 0 {
		req.Labels = labels
	}
	ck, err := cl.CreateCheckpoint(ctx, pos[0], req)
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", pos[0], err)
	}
	if *asJSON {
		return printJSON(c.stdout, ck)
	}
	_, err = fmt.Fprintln(c.stdout, ck.ID)
	return err
}

func runCheckpointList(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("checkpoint ls")
	labels := kvFlag{}
	fs.Var(labels, "label", "only checkpoints with this K=V label (repeatable)")
	limit := fs.Int("limit", 0, "at most this many (0: the gateway's default, 100)")
	asJSON := fs.Bool("json", false, "print the checkpoints as JSON")
	_, cl, err := c.start(fs, args, 0, 0)
	if err != nil {
		return err
	}
	cks, err := cl.ListCheckpoints(ctx, labels, *limit)
	if err != nil {
		return fmt.Errorf("list checkpoints: %w", err)
	}
	if *asJSON {
		if cks == nil {
			cks = []client.Checkpoint{}
		}
		return printJSON(c.stdout, cks)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSANDBOX\tPOOL\tSIZE\tFILES\tCREATED\tEXPIRES\tLABELS")
	for _, ck := range cks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", ck.ID, ck.Sandbox, ck.Pool, ck.SizeBytes, ck.Files,
			formatTime(ck.CreatedAt), formatTime(ck.ExpiresAt), kvFlag(ck.Labels))
	}
	return tw.Flush()
}

func runCheckpointRemove(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("checkpoint rm")
	pos, cl, err := c.start(fs, args, 1, -1)
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range pos {
		if err := cl.DeleteCheckpoint(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", id, err))
			continue
		}
		fmt.Fprintln(c.stdout, id)
	}
	return errors.Join(errs...)
}

func runRestore(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("sandbox restore")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	pos, cl, err := c.start(fs, args, 2, 2)
	if err != nil {
		return err
	}
	res, err := cl.RestoreSandbox(ctx, pos[0], pos[1])
	if err != nil {
		return fmt.Errorf("restore %s into %s: %w", pos[1], pos[0], err)
	}
	if *asJSON {
		return printJSON(c.stdout, res)
	}
	_, err = fmt.Fprintf(c.stdout, "%s: restored %s (%d entries, %d bytes) in %d ms\n", res.SandboxID, res.Checkpoint, res.Files, res.Bytes, res.DurationMS)
	return err
}

func runFork(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("sandbox fork")
	var req client.ForkRequest
	fs.IntVar(&req.Count, "n", 1, "how many sandboxes (1 to 100)")
	fs.IntVar(&req.LeaseSeconds, "lease-seconds", 0, "lease length of each fork in seconds (0: the pool's default)")
	fs.Var(listFlag{&req.Paths}, "path", "a path the fork copies, absolute or relative to the work dir (repeatable; default: the work dir)")
	fs.Var(listFlag{&req.Exclude}, "exclude", "a pattern of entries the fork leaves out (repeatable)")
	labels := kvFlag{}
	fs.Var(labels, "label", "K=V label of each fork (repeatable; default: the source's labels)")
	fs.BoolVar(&req.KeepCheckpoint, "keep-checkpoint", false, "keep the checkpoint the fork takes (its id is printed to stderr)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	pos, cl, err := c.start(fs, args, 1, 1)
	if err != nil {
		return err
	}
	if len(labels) > 0 {
		req.Labels = labels
	}
	res, err := cl.ForkSandbox(ctx, pos[0], req)
	if err != nil {
		return fmt.Errorf("fork %s: %w", pos[0], err)
	}
	if *asJSON {
		return printJSON(c.stdout, res)
	}
	if req.KeepCheckpoint {
		fmt.Fprintf(c.stderr, "checkpoint %s kept\n", res.Checkpoint.ID)
	}
	failed := 0
	for i, f := range res.Forks {
		if f.Error != nil {
			failed++
			fmt.Fprintf(c.stderr, "fork %d: %s (%d %s)\n", i+1, f.Error.Message, f.Error.Status, f.Error.Code)
			continue
		}
		fmt.Fprintln(c.stdout, f.Sandbox.ID)
	}
	if failed > 0 {
		return fmt.Errorf("fork %s: %d of %d forks failed", pos[0], failed, len(res.Forks))
	}
	return nil
}
