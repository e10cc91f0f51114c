package fakebank_test

import (
	"context"
	"fmt"

	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// The bank applies a payment, then drops the connection: the caller cannot tell whether it
// happened, the bank's ledger can, and a resend under the same key returns the stored payment.
func Example_dropAfterApply() {
	ctx := context.Background()
	bank := fakebank.New(nil)
	if err := bank.Start(); err != nil {
		panic(err)
	}
	defer bank.Close()

	client := fakebank.NewClient(bank.URL(), nil)
	req := fakebank.PaymentRequest{Account: "merchant-7", Amount: 1250, Currency: "EUR", Reference: "settle-7"}

	bank.FailNext(1, fakebank.DropAfterApply)
	_, err := client.Pay(ctx, "op-7", req)
	fmt.Println("failed:", err != nil, "not processed:", fakebank.IsNotProcessed(err))
	fmt.Println("effects:", bank.Effects("op-7"))

	p, err := client.Pay(ctx, "op-7", req)
	if err != nil {
		panic(err)
	}
	fmt.Println(p.Status, p.Amount, p.Currency, "effects:", bank.Effects("op-7"))

	// Output:
	// failed: true not processed: false
	// effects: 1
	// succeeded 1250 EUR effects: 1
}
