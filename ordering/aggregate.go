package ordering

// Aggregate names the entity a sequence belongs to.
type Aggregate struct {
	Type string
	ID   string
}

func (a Aggregate) String() string { return a.Type + "/" + a.ID }
