package console

import (
	"math"
	"testing"
)

func TestMoneyUsesTheCurrencysMinorUnit(t *testing.T) {
	for _, c := range []struct {
		amount   int64
		currency string
		want     string
	}{
		{6157, "USD", "61.57 USD"},
		{5, "EUR", "0.05 EUR"},
		{-1050, "EUR", "-10.50 EUR"},
		{1000, "JPY", "1000 JPY"},
		{12345, "KWD", "12.345 KWD"},
		{42, "", "42"},
		{math.MinInt64, "EUR", "-92233720368547758.08 EUR"},
	} {
		if got := money(c.amount, c.currency); got != c.want {
			t.Errorf("money(%d, %q) = %q, want %q", c.amount, c.currency, got, c.want)
		}
	}
}
