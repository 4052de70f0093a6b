// Package docker is the provider that runs each sandbox task as a Docker
// container of the pool's image, on one Docker engine (a laptop or a single
// big host). Any image works: the static exec agent is bind-mounted
// read-only from the host into the container and is its entry point, so
// images need not be rebuilt for Quarry; an image needs only a shell
// (/bin/sh, or bash), which Launch checks before the container starts. The
// work directory (HOME) is a tmpfs owned by the sandbox's user.
//
// Isolation is on by default: never privileged, every capability dropped
// but a small documented set (which an unprivileged user does not hold
// anyway), no-new-privileges, CPU, memory (no swap) and pids limits, an
// unprivileged user (65534 unless the pool names another uid), and the
// agent's port published on 127.0.0.1 only (host networking is a pool
// option). Every container carries the quarry.* labels (managed, pool,
// task, gateway).
//
// The provider keeps nothing in memory that matters: List and Describe
// read the containers and their labels from the engine, and each task's
// agent token is derived from a key file (Config.TokenKeyFile) and a random
// nonce label of the container, so a restarted gateway finds, describes and
// stops the containers of an earlier one. The token reaches the agent on its
// stdin, written once when the container starts, never through the
// container's environment, labels or files. Task ids are container ids;
// container names are the task names, so a retried launch of a name finds
// its container. Stop removes the container.
//
// Copy-on-write layers (layers.go, providers.Layers): a checkpoint is
// unpacked once into an engine volume, and tasks launched on it get an
// overlay volume (the layer below, volumes of their own above) at their
// work directory's parent instead of the tmpfs; every such directory is the
// engine's, so the gateway stays unprivileged. The only state in memory is
// which layers a prepare or launch of this process holds, so that none is
// removed under it.
//
// This package must not import gateway, warmpool or another provider.
package docker
