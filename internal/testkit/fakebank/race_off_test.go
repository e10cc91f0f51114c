//go:build !race

package fakebank

const raceEnabled = false
