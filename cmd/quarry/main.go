package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/quarryhq/quarry/client"
)

// defaultURL is the gateway of `make run`.
const defaultURL = "http://127.0.0.1:8080"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// exitError ends the CLI with a remote command's exit status, without a message.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// exitCode is the process exit status for run's error: 0 for nil, the
// command's status for an *exitError, else 1 after writing the error on one
// line to stderr.
func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	fmt.Fprintf(stderr, "quarry: %s\n", strings.Join(strings.Fields(err.Error()), " "))
	return 1
}

// cli is one invocation: its streams, the gateway it talks to, and the
// environment (getenv) for the settings of `quarry tables`.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	url, apiKey    string
	getenv         func(string) string
}

// command is one subcommand.
type command struct {
	name, usage, summary string
	run                  func(ctx context.Context, c *cli, args []string) error
}

// group is a word the CLI starts with: a group of commands (quarry sandbox
// create) or, when its one command has its own name, that command (quarry
// pools).
type group struct {
	name    string
	aliases []string
	summary string // for the top-level help; a command on its own has its own
	cmds    []command
}

// groups is the one table of the CLI's commands: the top-level help, the
// dispatch and every command's usage are made from it.
func groups() []group {
	return []group{
		{"sandbox", []string{"sandboxes", "sb"}, "work with sandboxes: lease, run, copy, restore, fork, preview URLs", sandboxCommands()},
		{"checkpoint", []string{"checkpoints", "ckp"}, "checkpoints of sandboxes' paths", checkpointCommands()},
		{"image", []string{"images"}, "images on demand: prefetch, list, build", imageCommands()},
		{"pools", nil, "", []command{poolsCommand()}},
		{"tables", nil, "the DynamoDB lease store's tables", tablesCommands()},
		{"key", []string{"keys"}, "make API keys (for QUARRY_API_KEYS; --e2b: of E2B's shape)", keyCommands()},
	}
}

// single reports whether the group is one command of its own name.
func (g group) single() bool { return len(g.cmds) == 1 && g.cmds[0].name == g.name }

// topUsage is `quarry -h`: every command of groups.
func topUsage() string {
	var b strings.Builder
	b.WriteString("usage: quarry [--url URL] [--api-key KEY] <command> [args]\n\ncommands:\n")
	for _, g := range groups() {
		if g.single() {
			fmt.Fprintf(&b, "  %s\n      %s\n", g.name, g.cmds[0].summary)
			continue
		}
		names := make([]string, len(g.cmds))
		for i, cmd := range g.cmds {
			names[i] = cmd.name
		}
		fmt.Fprintf(&b, "  %s %s\n      %s (quarry %s -h)\n", g.name, strings.Join(names, "|"), g.summary, g.name)
	}
	b.WriteString("\nQUARRY_URL (default " + defaultURL + ") and QUARRY_API_KEY set the gateway and the key;\n" +
		"--url and --api-key (accepted by every command) override them.\n")
	return b.String()
}

// usageOf is the usage text of a command by its full name ("sandbox
// exec", "pools"), as its flag set is named; "" for no such command.
func usageOf(name string) string {
	for _, g := range groups() {
		for _, cmd := range g.cmds {
			if full := g.name + " " + cmd.name; full == name || (g.single() && cmd.name == name) {
				return "usage: " + cmd.usage + "\n\n" + cmd.summary + "\n"
			}
		}
	}
	return ""
}

// run is the whole CLI; main only adds signals and the exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr, url: os.Getenv("QUARRY_URL"), apiKey: os.Getenv("QUARRY_API_KEY"), getenv: os.Getenv}
	if c.url == "" {
		c.url = defaultURL
	}
	err := c.top(ctx, args)
	if errors.Is(err, flag.ErrHelp) {
		return nil // usage was printed
	}
	return err
}

// top dispatches the first argument.
func (c *cli) top(ctx context.Context, args []string) error {
	fs := c.flags("quarry")
	if err := c.parseFlags(fs, args, topUsage()); err != nil {
		return err
	}
	pos := fs.Args() // flags of the command itself come after its name
	if len(pos) == 0 {
		return errors.New("missing command (see quarry -h)")
	}
	if pos[0] == "help" {
		_, err := io.WriteString(c.stdout, topUsage())
		return err
	}
	for _, g := range groups() {
		if pos[0] != g.name && !slices.Contains(g.aliases, pos[0]) {
			continue
		}
		if g.single() {
			return c.dispatch(ctx, "quarry", g.cmds, pos)
		}
		return c.dispatch(ctx, "quarry "+g.name, g.cmds, pos[1:])
	}
	return fmt.Errorf("unknown command %q (see quarry -h)", pos[0])
}

// dispatch runs the command of cmds named by args[0].
func (c *cli) dispatch(ctx context.Context, prefix string, cmds []command, args []string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: %s <command> [flags] [args]\n\ncommands:\n", prefix)
	for _, cmd := range cmds {
		fmt.Fprintf(&b, "  %-10s %s\n", cmd.name, cmd.summary)
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		_, err := io.WriteString(c.stdout, b.String())
		return err
	}
	for _, cmd := range cmds {
		if cmd.name == args[0] {
			return cmd.run(ctx, c, args[1:])
		}
	}
	return fmt.Errorf("unknown command %q (see %s -h)", args[0], prefix)
}

// flags returns a flag set for a command with the global flags on it; it
// writes nothing itself (parse reports errors and help).
func (c *cli) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.url, "url", c.url, "gateway URL (env QUARRY_URL)")
	fs.Var(secretFlag{&c.apiKey}, "api-key", "API `key` (env QUARRY_API_KEY; never printed)")
	return fs
}

// secretFlag is a string flag whose value help never prints (its default
// comes from QUARRY_API_KEY).
type secretFlag struct{ p *string }

func (s secretFlag) String() string { return "" }

func (s secretFlag) Set(v string) error {
	*s.p = v
	return nil
}

// parse parses flags placed anywhere before a "--" and returns the other
// arguments in order (pos) and those after the "--" (rest, nil without one).
// For -h it prints usage and the flags to stdout and returns flag.ErrHelp,
// which run turns into success.
func (c *cli) parse(fs *flag.FlagSet, args []string, usage string) (pos, rest []string, err error) {
	before := args
	for i, a := range args {
		if a == "--" {
			before, rest = args[:i], append([]string{}, args[i+1:]...)
			break
		}
	}
	for {
		if err := c.parseFlags(fs, before, usage); err != nil {
			return nil, nil, err
		}
		before = fs.Args()
		if len(before) == 0 {
			break
		}
		pos, before = append(pos, before[0]), before[1:]
	}
	return pos, rest, nil
}

// parseFlags parses the flags at the start of args. For -h it prints usage
// and the flags to stdout and returns flag.ErrHelp.
func (c *cli) parseFlags(fs *flag.FlagSet, args []string, usage string) error {
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(c.stdout, usage, "\nflags:\n")
		fs.SetOutput(c.stdout)
		fs.PrintDefaults()
		return flag.ErrHelp
	case err != nil:
		return fmt.Errorf("%s: %w", fs.Name(), err)
	}
	return nil
}

// client returns a client for the configured gateway and key.
func (c *cli) client() (*client.Client, error) {
	u, err := url.Parse(c.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--url (QUARRY_URL): want http(s)://host:port, got %q", c.url)
	}
	if c.apiKey == "" {
		return nil, errors.New("--api-key (QUARRY_API_KEY): must be set")
	}
	return client.New(c.url, c.apiKey), nil
}

// kvFlag is a repeatable K=V flag.
type kvFlag map[string]string

func (f kvFlag) String() string {
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + f[k]
	}
	return strings.Join(keys, ",")
}

func (f kvFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want K=V, got %q", s)
	}
	f[k] = v
	return nil
}
