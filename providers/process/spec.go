package process

import (
	"fmt"
	"maps"
	"slices"

	"github.com/quarryhq/quarry/providers"
)

// maxNameLen bounds a task name (it is a directory name).
const maxNameLen = 128

// validateSpec returns a *providers.LaunchError wrapping
// providers.ErrInvalidSpec when this provider cannot serve spec. The reason
// names the offending field.
func validateSpec(spec providers.Spec) error {
	reason := specProblem(spec)
	if reason == "" {
		return nil
	}
	return providers.InvalidSpec(spec, reason)
}

func specProblem(spec providers.Spec) string {
	if spec.Pool == "" {
		return "pool: must be set"
	}
	if spec.Image != "" && spec.Image != "host" {
		return fmt.Sprintf("image %q: the process provider runs sandboxes on the host; use \"\" or \"host\"", spec.Image)
	}
	if spec.CPU < 0 {
		return fmt.Sprintf("cpu: must not be negative, got %g", spec.CPU)
	}
	if spec.MemoryMB < 0 {
		return fmt.Sprintf("memory: must not be negative, got %d", spec.MemoryMB)
	}
	if spec.DiskMB != 0 {
		// The work directory is a directory on the host's file system,
		// shared with the gateway and every other sandbox: nothing here can
		// bound one sandbox's share of it without root (a loop mount, a
		// project quota), so a size would be a promise the provider does
		// not keep.
		return fmt.Sprintf("disk: the process provider cannot bound a sandbox's disk (its work directory is a directory on the host's file system); leave disk unset, or use the docker or ecs provider (got %d MiB)", spec.DiskMB)
	}
	if k, problem := providers.CheckEnv(spec.Env); problem != "" {
		return fmt.Sprintf("env %q: %s", k, problem)
	}
	for _, k := range sortedKeys(spec.Labels) {
		switch k {
		case providers.LabelManaged, providers.LabelPool, providers.LabelTask, providers.LabelGateway:
			return fmt.Sprintf("labels %q: reserved for the provider", k)
		}
	}
	if keys := sortedKeys(spec.Options); len(keys) > 0 {
		return fmt.Sprintf("options %q: the process provider has no options", keys[0])
	}
	return ""
}

// validateName checks that name can be a task id: a single directory name
// of letters, digits, '.', '_' and '-', not starting with '.'.
func validateName(name string) error {
	if name == "" {
		return fmt.Errorf("must not be empty")
	}
	if len(name) > maxNameLen {
		return fmt.Errorf("must be at most %d bytes, got %d", maxNameLen, len(name))
	}
	if name[0] == '.' {
		return fmt.Errorf("must not start with '.'")
	}
	for _, r := range name {
		ok := r == '-' || r == '_' || r == '.' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
		if !ok {
			return fmt.Errorf("character %q not allowed (use letters, digits, '.', '_', '-')", r)
		}
	}
	return nil
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
