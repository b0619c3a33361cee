package move

// StopAfter makes Run and Resume with cfg stop right after step k (1
// prepare, 2 close, 3 open, 4 drain, 5 release), as a crash there would, returning
// ErrStopped.
func StopAfter(cfg *Config, k int) *Config {
	c := *cfg
	c.stopAfter = k
	return &c
}

// ErrStopped is what a run cut short by StopAfter returns.
var ErrStopped = errStopped

// PauseAt makes Run and Resume with cfg call f before step 1 (with 0),
// after each step k (with k) and after a rollback ended the reservation
// on the target (with StepTargetRolledBack); f blocks to hold the mover
// there.
func PauseAt(cfg *Config, f func(step int)) *Config {
	c := *cfg
	c.pause = f
	return &c
}

// StepTargetRolledBack is the step PauseAt's f gets once a rollback ended
// the reservation on the target, before it reopens the source.
const StepTargetRolledBack = stepTargetRolledBack
