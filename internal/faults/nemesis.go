package faults

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// FaultKind is a fault the nemesis injects.
type FaultKind string

// The nemesis's faults.
const (
	// KillReplica: SIGKILL a replica, and start it again after the fault's
	// duration.
	KillReplica FaultKind = "kill-replica"
	// PauseReplica: SIGSTOP a replica for the fault's duration, then
	// SIGCONT: it wakes with the beliefs it had.
	PauseReplica FaultKind = "pause-replica"
	// StoreLatency, StoreReset, StoreBlackhole: the replica's connections
	// to the lease store suffer the Proxy fault of that name.
	StoreLatency   FaultKind = "store-latency"
	StoreReset     FaultKind = "store-reset"
	StoreBlackhole FaultKind = "store-blackhole"
	// KillAgent: kill a leased sandbox from outside (the process
	// provider's agent with SIGKILL, a Docker container with docker kill):
	// it dies under its holder.
	KillAgent FaultKind = "kill-agent"
	// DiskFull: the replicas' data directory is filled to the last byte
	// for the fault's duration.
	DiskFull FaultKind = "disk-full"
	// RestartEngine: stop the Docker engine and start it again (the
	// fault's duration is the restart's own); its containers die with it.
	RestartEngine FaultKind = "restart-engine"
)

// AllFaults is every fault, for a schedule that uses them all.
var AllFaults = []FaultKind{KillReplica, PauseReplica, StoreLatency, StoreReset, StoreBlackhole, KillAgent, DiskFull, RestartEngine}

// Fault is one scheduled fault: at At (since the run began), Kind against
// replica Target (ignored by KillAgent, which picks a leased sandbox by
// Pick), healed after For.
type Fault struct {
	At     time.Duration
	Kind   FaultKind
	Target int
	For    time.Duration
	Pick   uint64 // which sandbox KillAgent kills: Pick mod the number leased then
}

func (f Fault) String() string {
	return fmt.Sprintf("%.1fs %s r%d for %.1fs", f.At.Seconds(), f.Kind, f.Target, f.For.Seconds())
}

// Schedule is the nemesis's plan for a run of the given duration against
// replicas replicas: one fault at a time, each followed by a quiet gap
// (gap to 2×gap) in which the system may recover; each fault lasts
// between minFor and maxFor. The same seed gives the same schedule.
func Schedule(seed uint64, duration time.Duration, replicas int, kinds []FaultKind,
	gap, minFor, maxFor time.Duration) []Fault {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var out []Fault
	at := gap
	for {
		f := Fault{
			At:     at,
			Kind:   kinds[r.IntN(len(kinds))],
			Target: r.IntN(replicas),
			For:    minFor + time.Duration(r.Int64N(int64(maxFor-minFor)+1)),
			Pick:   r.Uint64(),
		}
		if f.At+f.For > duration {
			return out
		}
		out = append(out, f)
		at = f.At + f.For + gap + time.Duration(r.Int64N(int64(gap)+1))
	}
}
