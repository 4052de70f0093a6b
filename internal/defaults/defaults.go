// Package defaults fills the zero fields of a component's Config with their
// defaults: the one helper every Config's WithDefaults uses.
//
// It imports nothing from Quarry.
package defaults

// Set sets *p to v when *p is the zero value.
func Set[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// Positive sets *p to v when *p is zero or negative.
func Positive[T ~int | ~int64 | ~float64](p *T, v T) {
	if *p <= 0 {
		*p = v
	}
}
