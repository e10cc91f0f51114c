package workflowtest

// ScopedCheckSQL exports the SQL of every check CheckInvariants runs, with the scope of runs
// (nil: the whole database), and its arguments, to the tests of their plans.
func ScopedCheckSQL(runs []string) (sqls []string, args []any) {
	for _, c := range stepwiseChecks {
		sql, a := scoped(c.sql, runs)
		sqls = append(sqls, sql)
		args = a
	}
	for _, sql := range ledgerSQL {
		s, _ := scoped(sql, runs)
		sqls = append(sqls, s)
	}
	return sqls, args
}
