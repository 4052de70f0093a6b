package ecs

import (
	"github.com/aws/aws-sdk-go-v2/service/ecs"

	"github.com/quarryhq/quarry/providers"
)

// RenderTaskDefinition returns the task definition a Provider with cfg
// registers for spec: the same checks and the same rendering as Launch,
// without any AWS call. It is for tools and tests that run the definition
// elsewhere (tests/ecs_layout_test.go runs it on Docker). cfg gets its
// defaults and must pass Validate. It fails with a *providers.LaunchError
// (ErrInvalidSpec) naming the field when the spec is invalid, or when the
// pool supplies its own task definition (there is nothing to render). The
// result is the caller's; safe for concurrent use.
func RenderTaskDefinition(cfg Config, spec providers.Spec) (*ecs.RegisterTaskDefinitionInput, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	set, err := resolve(cfg, spec)
	if err != nil {
		return nil, err
	}
	if set.taskDef != "" {
		return nil, providers.InvalidSpec(spec, "options."+optTaskDefinition+": the pool supplies its own task definition; nothing to render")
	}
	return renderTaskDef(cfg, spec, set), nil
}
