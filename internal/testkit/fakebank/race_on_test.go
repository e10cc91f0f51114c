//go:build race

package fakebank

const raceEnabled = true
