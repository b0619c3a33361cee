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
