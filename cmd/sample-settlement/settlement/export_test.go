package settlement

// DatePayoutsSQL exports the date's payout query to the tests of its plan.
const DatePayoutsSQL = datePayoutsSQL
