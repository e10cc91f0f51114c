package retention_test

import (
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stepwise-go/stepwise"
	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { os.Exit(testkit.Main(m)) }

// operator is the operator client a person's tools use to read slots.
func operator(t testing.TB, pool *pgxpool.Pool) *stepwise.Client {
	t.Helper()
	c, err := stepwise.NewOperatorClient(pool)
	require.NoError(t, err)
	return c
}
