package shard

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// Fleet lists the shards a relay fleet drains and the targets a routing
// consumer applies records in. Either list may be empty.
type Fleet struct {
	Shards  []Shard `json:"shards,omitempty"`
	Targets []Shard `json:"targets,omitempty"`
}

// maxFileBytes bounds a fleet file: 300 tenant schemas take about 40 KiB.
const maxFileBytes = 16 << 20

// Validate checks every shard and target (filling in default schemas) and
// that names are unique within each list and that no two entries name the
// same database and schema.
func (f *Fleet) Validate() error {
	for _, list := range []struct {
		what   string
		shards []Shard
	}{{"shards", f.Shards}, {"targets", f.Targets}} {
		names := map[string]bool{}
		places := map[string]string{}
		for i := range list.shards {
			s := &list.shards[i]
			if err := s.Validate(); err != nil {
				return fmt.Errorf("%s[%d]: %w", list.what, i, err)
			}
			if names[s.Name] {
				return fmt.Errorf("%s[%d]: name %s is used twice; each entry needs a name of its own", list.what, i, s.Name)
			}
			names[s.Name] = true
			server, err := s.Server()
			if err != nil {
				return err
			}
			place := server + "/" + s.Schema
			if other, ok := places[place]; ok {
				return fmt.Errorf("%s[%d]: %s and %s are the same database and schema (%s); list it once", list.what, i, other, s.Name, s.Schema)
			}
			places[place] = s.Name
		}
	}
	return nil
}

// Load reads and validates a fleet file (see the package documentation).
func Load(path string) (Fleet, error) {
	fh, err := os.Open(path) //nolint:gosec // the operator names the file
	if err != nil {
		return Fleet{}, fmt.Errorf("shard: open fleet file: %w", err)
	}
	defer func() { _ = fh.Close() }()
	f, err := Parse(fh)
	if err != nil {
		return Fleet{}, fmt.Errorf("shard: fleet file %s: %w", path, err)
	}
	return f, nil
}

// Parse reads and validates a fleet from JSON. Unknown fields are refused,
// so that a misspelt "schema" cannot silently point at the default one.
func Parse(r io.Reader) (Fleet, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxFileBytes+1))
	if err != nil {
		return Fleet{}, err
	}
	if len(data) > maxFileBytes {
		return Fleet{}, fmt.Errorf("longer than %d bytes", maxFileBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f Fleet
	if err := dec.Decode(&f); err != nil {
		return Fleet{}, fmt.Errorf("not a fleet (JSON with \"shards\" and \"targets\" lists of name, database and schema): %w", err)
	}
	if dec.More() {
		return Fleet{}, fmt.Errorf("holds more than one JSON value")
	}
	if len(f.Shards)+len(f.Targets) == 0 {
		return Fleet{}, fmt.Errorf("names no shards and no targets")
	}
	if err := f.Validate(); err != nil {
		return Fleet{}, err
	}
	return f, nil
}

// Shard returns the shard named name, from Shards.
func (f *Fleet) Shard(name string) (Shard, bool) {
	return find(f.Shards, name)
}

// Target returns the target named name, from Targets.
func (f *Fleet) Target(name string) (Shard, bool) {
	return find(f.Targets, name)
}

func find(list []Shard, name string) (Shard, bool) {
	for _, s := range list {
		if s.Name == name {
			return s, true
		}
	}
	return Shard{}, false
}
