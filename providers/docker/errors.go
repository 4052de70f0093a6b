package docker

import (
	cerrdefs "github.com/containerd/errdefs"
)

// Classifiers of the engine's errors, used at the edge to translate them.

// isNotFound: no such container, image, path or network.
func isNotFound(err error) bool { return err != nil && cerrdefs.IsNotFound(err) }

// isConflict: a container name in use, a removal already in progress.
func isConflict(err error) bool { return err != nil && cerrdefs.IsConflict(err) }

// isInvalid: the engine refused the request's parameters.
func isInvalid(err error) bool { return err != nil && cerrdefs.IsInvalidArgument(err) }
